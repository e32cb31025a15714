#pragma once
// Binding results as plain Python values, by one mechanism: a bound object becomes the dict of its
// public properties in binding order (base classes first), recursively; lists, tuples and dicts
// are walked, enums become their names. So what a result's dict holds is decided where its
// properties are bound: name a property after its key, reshape in its getter (finite_or_none,
// columns), and name what stays out of the dict in def_to_dict. Nothing is copied field by field.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <initializer_list>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dra::python {

namespace to_dict_detail {
namespace py = pybind11;

// A cycle of properties (an object reachable from itself) would recurse forever.
constexpr int max_depth = 64;

inline bool is_bound(py::handle v) {
  return py::detail::get_type_info(Py_TYPE(v.ptr())) != nullptr;
}

// What a class contributes to a dict: its public properties in binding order, base classes
// first, less what it names in `_dict_skip`; or, for an enum, its name.
struct field {
  py::str name;
  py::object get;  // the property's getter, called directly (no attribute lookup per value)
};

struct layout {
  unsigned int version = 0;  // the class's version tag when read (0: none; read again)
  bool is_enum = false;
  std::vector<field> fields;
};

inline layout read_layout(PyTypeObject* type) {
  const py::handle t(reinterpret_cast<PyObject*>(type));
  layout out;
  out.is_enum = py::hasattr(t, "__members__");
  const py::object skip = py::getattr(t, "_dict_skip", py::tuple());
  const py::tuple mro = t.attr("__mro__");
  for (std::size_t i = mro.size(); i-- > 0;) {
    PyObject* dict = reinterpret_cast<PyTypeObject*>(mro[i].ptr())->tp_dict;
    if (dict == nullptr) continue;  // a static built-in type (Python 3.12+): no properties of ours
    for (auto item : py::reinterpret_borrow<py::dict>(dict)) {
      if (!PyObject_TypeCheck(item.second.ptr(), &PyProperty_Type) || item.second.attr("fget").is_none()) continue;
      if (item.first.cast<std::string>().rfind('_', 0) == 0 || skip.contains(item.first)) continue;
      bool seen = false;
      for (const auto& f : out.fields) seen = seen || f.name.equal(item.first);
      if (!seen) out.fields.push_back({py::reinterpret_borrow<py::str>(item.first), item.second.attr("fget")});
    }
  }
  return out;
}

// Read once per class and kept while the class is unchanged: CPython gives a class a new version
// tag whenever it or a base changes (PyType_Modified), so a property added later is seen.
inline const layout& layout_of(PyTypeObject* type) {
  // Never freed: it holds Python strings, which must not be released after the interpreter ends.
  static auto* cache = new std::unordered_map<PyTypeObject*, layout>();
  auto& entry = (*cache)[type];
  if (entry.version == 0 || entry.version != type->tp_version_tag) {
    entry = read_layout(type);
    entry.version = type->tp_version_tag;
  }
  return entry;
}

inline const std::vector<field>& fields(py::handle type) {
  return layout_of(reinterpret_cast<PyTypeObject*>(type.ptr())).fields;
}

py::object plain(py::handle v, int depth);

inline py::dict object_dict(py::handle v, int depth) {
  py::dict d;
  const auto fs = fields(py::type::handle_of(v));  // a copy: a getter could change the class
  for (const auto& f : fs) d[f.name] = plain(f.get(v), depth + 1);
  return d;
}

inline py::object plain(py::handle v, int depth) {
  if (depth > max_depth)
    throw py::value_error("to_dict: values nested deeper than " + std::to_string(max_depth) + " levels (a cycle?) at " +
                          py::repr(py::type::handle_of(v)).cast<std::string>());
  if (v.is_none() || PyBool_Check(v.ptr()) || PyLong_Check(v.ptr()) || PyFloat_Check(v.ptr()) ||
      PyUnicode_Check(v.ptr()) || PyBytes_Check(v.ptr()))
    return py::reinterpret_borrow<py::object>(v);
  if (PyList_Check(v.ptr())) {
    py::list out;
    for (auto x : v) out.append(plain(x, depth + 1));
    return std::move(out);
  }
  if (PyTuple_Check(v.ptr())) {
    py::list out;
    for (auto x : v) out.append(plain(x, depth + 1));
    return py::tuple(out);
  }
  if (PyDict_Check(v.ptr())) {
    py::dict out;
    for (auto item : py::reinterpret_borrow<py::dict>(v)) out[item.first] = plain(item.second, depth + 1);
    return std::move(out);
  }
  if (layout_of(Py_TYPE(v.ptr())).is_enum) return v.attr("name");
  if (is_bound(v)) return object_dict(v, depth);
  return py::reinterpret_borrow<py::object>(v);
}
}  // namespace to_dict_detail

/// The plain value of any Python value: bound objects as dicts of their properties (recursively).
inline pybind11::object to_plain(pybind11::handle v) {
  return to_dict_detail::plain(v, 0);
}

/// A bound object as the dict of its properties.
inline pybind11::dict to_dict(pybind11::handle bound) {
  if (!to_dict_detail::is_bound(bound))
    throw pybind11::type_error("to_dict: expected an object of a bound class, got " +
                               pybind11::repr(pybind11::type::handle_of(bound)).cast<std::string>());
  return to_dict_detail::object_dict(bound, 0);
}

/// A C++ value of a bound class as a dict (what a binding returns where the API is a dict).
template <class T>
pybind11::dict dict_of(T&& value) {
  return to_dict(pybind11::cast(std::forward<T>(value)));
}

/// A vector of a bound class as a list of dicts.
template <class T>
pybind11::list list_of(const std::vector<T>& values) {
  return to_plain(pybind11::cast(values)).template cast<pybind11::list>();
}

/// Attaches to_dict() to a bound class (a py::class_, a handle: returned for chaining); `skip`
/// names properties that stay attributes only.
template <class Class>
Class def_to_dict(Class cls, std::initializer_list<const char*> skip = {}) {
  namespace py = pybind11;
  if (skip.size() > 0) {
    py::tuple names(skip.size());
    std::size_t i = 0;
    for (const char* s : skip) names[i++] = py::str(s);
    cls.attr("_dict_skip") = names;
  }
  cls.def(
      "to_dict", [](py::handle self) { return to_dict(self); },
      "Every property as a plain dict (nested results as dicts), e.g. for json.dumps.");
  return cls;
}

/// A property getter: the member, or None where it is not finite (NaN: not reached; inf: never).
template <class T>
auto finite_or_none(double T::* member) {
  return [member](const T& o) { return std::isfinite(o.*member) ? std::optional<double>(o.*member) : std::nullopt; };
}

/// Rows of a bound class as columns: {property: [value of each row]}, compact and ready to plot.
template <class T>
pybind11::dict columns(const std::vector<T>& rows) {
  namespace py = pybind11;
  const auto fs = to_dict_detail::fields(py::type::of<T>());
  std::vector<py::list> cols(fs.size());
  for (const auto& row : rows) {
    const py::object o = py::cast(&row, py::return_value_policy::reference);
    for (std::size_t i = 0; i < fs.size(); ++i) cols[i].append(to_plain(fs[i].get(o)));
  }
  py::dict out;
  for (std::size_t i = 0; i < fs.size(); ++i) out[fs[i].name] = cols[i];
  return out;
}

}  // namespace dra::python
