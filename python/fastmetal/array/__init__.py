"""``fastmetal.array``: the Array as users see it. ``surface`` attaches every Python method,
operator and property of ``fastmetal.Array`` (a C++ class) when it is imported."""
from . import surface  # noqa: F401
