import types

import pytest

from spec_compat.shims.module_view import ModuleView


def test_overrides_win_and_everything_else_is_the_real_modules_at_access_time():
    real = types.SimpleNamespace(a=1, f=lambda: "real", sub=types.SimpleNamespace(x=1, y=2))
    view = ModuleView(real, f=lambda: "view", sub=ModuleView(real.sub, y=20))
    assert view.f() == "view" and view.a == 1
    assert (view.sub.x, view.sub.y) == (1, 20)
    real.a = 2
    assert view.a == 2  # looked up when asked, not copied
    assert real.f() == "real" and real.sub.y == 2  # the real module is untouched
    with pytest.raises(AttributeError):
        view.missing
    assert repr(view) == f"<spec_compat view of {real!r}>"


def test_an_uninitialised_view_raises_attribute_error_not_recursion():
    view = ModuleView.__new__(ModuleView)
    with pytest.raises(AttributeError):
        view.anything
