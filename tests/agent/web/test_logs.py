"""`agent.web.logs`: the newest lines as they were logged."""

from __future__ import annotations

import logging

import pytest

from agent.web.logs import AUDIT, RecentLogs


def test_recent_logs_keep_the_newest_lines_as_they_were_logged() -> None:
    logs = RecentLogs(size=2)
    logger = logging.getLogger("test.recent")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(logs)
    try:
        values = [1]
        logger.warning("first %s", values)
        values.append(2)
        logger.info("second")
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("third")
        logger.debug("not kept (below INFO)")
    finally:
        logger.removeHandler(logs)
    lines = logs.to_json()
    assert [line["message"] for line in lines] == ["second", "third (ValueError: boom)"]
    logs = RecentLogs(size=5)
    logger.addHandler(logs)
    logger.warning("first %s", values)
    values.append(3)
    logger.removeHandler(logs)
    assert logs.to_json()[0]["message"] == "first [1, 2]", "formatted when logged, not when read"
    assert lines[1]["level"] == "ERROR" and lines[1]["logger"] == "test.recent"


@pytest.mark.slow
def test_audit_lines_outlive_a_flood_of_other_lines() -> None:
    """A page action's audit line (``extra=AUDIT``) has a ring of its own: 20,000 other lines,
    which anyone on the broker could once cause, do not push it out."""
    logs = RecentLogs(size=200, audit_size=2)
    logger = logging.getLogger("test.audit")
    logger.setLevel(logging.INFO)
    logger.addHandler(logs)
    try:
        logger.warning("status page: rollback requested from 10.0.0.9:51234", extra=AUDIT)
        for i in range(20_000):
            logger.error("deployment: refused %d", i)
        logger.warning("status page: restart of camera 'door' requested from 10.0.0.9:51240", extra=AUDIT)
    finally:
        logger.removeHandler(logs)
    lines = logs.to_json()
    audit = [line["message"] for line in lines if line["audit"]]
    assert audit == [
        "status page: rollback requested from 10.0.0.9:51234",
        "status page: restart of camera 'door' requested from 10.0.0.9:51240",
    ]
    others = [line["message"] for line in lines if not line["audit"]]
    assert len(others) == 200 and others[-1] == "deployment: refused 19999"
    assert [line["ts"] for line in lines] == sorted(line["ts"] for line in lines), "one list, oldest first"
