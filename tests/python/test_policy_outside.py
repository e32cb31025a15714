"""A resize policy written by a user (outside review): policies are C++ (docs/guide/policy.md, "Your
own policy"), so a Python subclass of a policy class, whose override the engine would never call, is
refused when it is defined instead of deciding silently as its base class."""

from __future__ import annotations

import pytest

import dra
from dra import _core


@pytest.mark.parametrize("base", [_core.GoodputPolicy, _core.ConvergencePhasePolicy, _core.ConvergenceAwarePolicy])
def test_a_python_subclass_of_a_policy_is_refused(base: type) -> None:
    # Before: the subclass was accepted and ConstrainedPolicy decided as `base` ("goodput: size 4
    # maximises goodput ..."), never calling the user's propose.
    with pytest.raises(TypeError, match="not an acceptable base type"):
        type("Mine", (base,), {"propose": lambda self, inputs, lo, hi: hi})


def test_the_policy_base_cannot_be_built_from_python() -> None:
    class Mine(_core.Policy):
        pass

    # Before: pybind11's "No constructor defined!", which names neither the cause nor the way out.
    for make in (Mine, _core.Policy, lambda: Mine(1, size=2)):
        with pytest.raises(TypeError, match=r"cannot be built or subclassed in Python.*policy='none' and "
                                            r"JobControl.set_capacity"):
            make()


def test_a_name_that_is_not_registered_is_refused_with_the_registered_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown policy 'mine' for the engine; use one of 'convergence'"):
        dra.Controller(policy="mine")
