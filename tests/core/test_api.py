"""The faces of the jaxshare packages say what they promise: each name listed once with
its home, ``__all__`` derived from that list, the type checker's names the same, every
name importable and documented, nothing imported before it is used -- each read in a
fresh interpreter, where an earlier test cannot have filled a package in."""

import warnings

import pytest

import jaxshare


@pytest.mark.subprocess
def test_the_face_lists_each_name_with_its_home(api_surface, jaxshare_face):
    face = api_surface(jaxshare_face)
    assert face["problems"] == []
    assert face["all"] == sorted(face["all"])
    dunders = {n for n in face["all"] if n.startswith("__")}
    assert set(face["type_checking"]) | dunders == set(face["all"])
    assert face["at_import"] == []  # Names are imported on first use...
    assert set(face["after"]) == set(face["all"]) - dunders  # ...and those are all there is.


@pytest.mark.subprocess
def test_importing_a_face_imports_no_framework(api_surface, jaxshare_face):
    """None; of the checkpoints' face, only orbax is asked about: it imports orbax only
    when a name is used."""
    frameworks = api_surface(jaxshare_face)["frameworks_at_import"]
    if jaxshare_face == "jaxshare.checkpoint":
        assert "orbax" not in frameworks
    else:
        assert frameworks == []


def test_the_top_level_is_the_tie_api():
    assert set(jaxshare.__all__) == {
        "AliasMap", "Naming", "NamingRecord", "Tied", "__version__", "checkpoint", "dedupe",
        "find_shared", "formats", "retie", "stream", "tie",
    }  # fmt: skip


@pytest.mark.parametrize("name", ["ArrayInfo", "Plan", "PlanEntry", "ProgressFn", "TensorSource"])
def test_a_moved_name_still_works_from_its_old_home_with_a_warning(name):
    with pytest.warns(DeprecationWarning, match=rf"`jaxshare.{name}` moved to `jaxshare.stream"):
        old = getattr(jaxshare, name)
    assert old is getattr(jaxshare.stream, name)


def test_unknown_attribute_is_an_attribute_error():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match="no_such_name"):
            jaxshare.no_such_name  # noqa: B018
