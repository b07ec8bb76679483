"""`edge-agent fleet push --waves`: a bad staging is refused before the broker is contacted."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (("--target", "device:cam-1", "--waves", "10%,100%"), "stages a rollout over a group"),
        (("--target", "group:g", "--waves", "50%,10%,100%"), "reach further than the one before"),
        (("--target", "group:g", "--waves", "10%,50%"), "last wave must reach 100"),
        (("--target", "group:g", "--waves", "ten,100"), "are not percentages"),
        (("--target", "group:g", "--waves", "10%,100%", "--max-failures", "lots"), "not a count"),
        (("--target", "group:g", "--waves", "10%,100%", "--wave-interval", "soon"), "not a duration"),
        (("--target", "group:g", "--id", "x" * 201), "--id must be 1 to 200 characters"),
    ],
)
def test_a_bad_staged_push_is_refused_before_the_broker_is_contacted(
    capsys: pytest.CaptureFixture[str], bundles: dict[str, Path], extra: tuple[str, ...], words: str
) -> None:
    from agent.cli import main

    try:
        status = main(["fleet", "push", str(bundles["v1"]), *extra, "--broker", "mqtt://127.0.0.1:9"])
    except SystemExit as usage:  # argparse: a value its type refuses
        status = int(str(usage.code))
    assert status in (1, 2)
    error = capsys.readouterr().err
    assert words in error and "cannot reach the broker" not in error, error
