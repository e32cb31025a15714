"""Single-process training on scikit-learn's bundled digits data, calling dra.step every step.

Shows the estimator's view as training goes (phase, smoothed loss, progress rate, gradient noise
scale) and the decision the policy would take. Runs on the CPU in seconds:

    .venv/bin/python examples/digits_single.py --epochs 30
"""

from __future__ import annotations

import argparse
import sys

import torch
from digits_data import build_model, load_data  # examples/ is on sys.path when run as a script

import dra


def grad_sqr_norm(model: torch.nn.Module) -> float:
    return float(sum(p.grad.pow(2).sum() for p in model.parameters() if p.grad is not None))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--print-every", type=int, default=50)
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch < 2:
        parser.error(f"--epochs must be >= 1 (got {args.epochs}) and --batch >= 2 (got {args.batch})")

    torch.manual_seed(args.seed)
    x_train, x_test, y_train, y_test = load_data(args.seed)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    controller = dra.reset(dra.Controller(policy="convergence", decide_every=10))
    half = args.batch // 2
    step = 0
    for epoch in range(args.epochs):
        order = torch.randperm(len(x_train))
        for start in range(0, len(order) - args.batch + 1, args.batch):
            idx = order[start : start + args.batch]
            # Two half-batch gradients and their mean give the two batch sizes of the
            # gradient-noise-scale estimator without any extra forward pass.
            optimizer.zero_grad()
            loss_fn(model(x_train[idx[:half]]), y_train[idx[:half]]).backward()
            small_a = grad_sqr_norm(model)
            grads_a = [p.grad.clone() for p in model.parameters()]
            optimizer.zero_grad()
            loss_b = loss_fn(model(x_train[idx[half:]]), y_train[idx[half:]])
            loss_b.backward()
            small_b = grad_sqr_norm(model)
            for p, g in zip(model.parameters(), grads_a):
                p.grad.add_(g).mul_(0.5)
            big = grad_sqr_norm(model)
            optimizer.step()
            with torch.no_grad():
                loss = loss_fn(model(x_train[idx]), y_train[idx])
            status = dra.step(
                loss,
                small_sqr_norm=(small_a + small_b) / 2,
                small_batch=half,
                big_sqr_norm=big,
                big_batch=2 * half,
            )
            if step % args.print_every == 0:
                s = status.signals
                print(
                    f"epoch {epoch:3d} step {step:5d}  loss {s.loss:.4f} (smoothed {s.smoothed_loss:.4f})  "
                    f"phase {s.phase:<9} d(log loss)/step {s.progress_rate:+.2e}±{s.progress_rate_stderr:.1e}  "
                    f"GNS {s.gns:7.1f}  decision: {status.decision.action} ({status.decision.reason[:60]})",
                    flush=True,
                )
            step += 1
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    s = controller.signals
    print(f"final: steps {step}, test accuracy {accuracy:.4f}, phase {s.phase}, best loss {s.best_loss:.4f}, "
          f"GNS {s.gns:.1f}, non-finite losses {s.nonfinite_count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
