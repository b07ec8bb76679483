"""`agent.web.logs`: the newest lines as they were logged."""

from __future__ import annotations

import logging

from agent.web.logs import RecentLogs


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
