"""`agent.fleet.versions`: version filters as the operator writes them, compared by SemVer's
precedence (not as text); which devices are too old for a document's protocol."""

from __future__ import annotations

import pytest

from agent.fleet.versions import MAX_SPEC, VersionSpec, too_old
from agent.mqtt.device_documents import StatusDocument


@pytest.mark.parametrize(
    ("spec", "version", "matches"),
    [
        ("<0.2.0", "0.1.0", True),
        ("<0.2.0", "0.2.0", False),
        ("<=0.2.0", "0.2.0", True),
        ("<0.10.0", "0.9.0", True),  # as text "0.9.0" > "0.10.0"
        (">0.9.0", "0.10.0", True),
        ("==0.2.0", "0.2.0", True),
        ("0.2.0", "0.2.0", True),  # no operator: ==
        ("==0.2.0", "0.2.1", False),
        ("!=0.2.0", "0.2.1", True),
        ("<0.2.0", "0.2.0-rc.1", True),  # a pre-release comes before its release
        (">=0.2.0,<0.3.0", "0.2.7", True),
        (">=0.2.0, <0.3.0", "0.3.0", False),
        (">=0.2.0", None, False),  # unknown: matches no filter
        ("!=0.2.0", "0+unknown", False),  # not SemVer: unknown
    ],
)
def test_a_filter_compares_by_semver_precedence(spec: str, version: str | None, matches: bool) -> None:
    assert VersionSpec.parse(spec).matches(version) is matches


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("~=0.2", "'~=0.2' in '~=0.2' is not a SemVer version"),
        ("<0.2", "'0.2' in '<0.2' is not a SemVer"),
        ("<0.2.0,", "'' is not a version clause"),
        ("=< 0.2.0", "'=< 0.2.0' is not a version clause"),
        ("<" + "1" * MAX_SPEC, f"at most {MAX_SPEC} characters"),
    ],
)
def test_a_filter_that_is_not_one_is_refused_naming_the_clause(spec: str, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        VersionSpec.parse(spec)


def test_too_old_names_the_devices_that_read_an_older_protocol() -> None:
    """A status without ``protocol`` (an agent before 0.2.0) reads protocol 1."""
    statuses = {
        "ancient": StatusDocument(state="online", agent_version="0.1.0"),
        "current": StatusDocument(state="online", agent_version="0.2.0", protocol=1),
        "newer": StatusDocument(state="offline", agent_version="0.3.0", protocol=2),
    }
    assert too_old(statuses, 1) == {}
    old = too_old(statuses, 2)
    assert list(old) == ["ancient", "current"]
    assert old["ancient"] == (
        "ancient runs edge-agent 0.1.0, which reads control documents of protocol 1 and older; this one is "
        "protocol 2, so it will refuse it: update edge-agent on ancient first"
    )
