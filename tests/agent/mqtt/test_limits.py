"""`agent.mqtt.limits`: chunks that fit the broker's maximum packet size."""

from __future__ import annotations

import pytest

from agent.mqtt.limits import BrokerLimits, fit_chunk_size, largest_payload, publish_packet_size
from agent.mqtt.protocol import Topics

CHUNK_TOPIC = Topics().chunk("f" * 64, 65536)


@pytest.mark.parametrize(
    ("requested", "maximum", "expected", "changed"),
    [
        (None, None, 256 * 1024, False),
        (1 << 20, None, 1 << 20, False),
        (None, 268_435_455, 256 * 1024, False),
        (None, 65_536, 63 * 1024, True),
        (256 * 1024, 131_072, 127 * 1024, True),  # AWS IoT Core's 128 KB
        (16 * 1024, 65_536, 16 * 1024, False),
    ],
)
def test_chunks_fit_the_broker(requested: int | None, maximum: int | None, expected: int, changed: bool) -> None:
    size, why = fit_chunk_size(requested, BrokerLimits(maximum_packet_size=maximum), CHUNK_TOPIC)
    assert size == expected and (why is not None) == changed
    if maximum is not None:
        assert publish_packet_size(CHUNK_TOPIC, size) <= maximum
        assert largest_payload(maximum, CHUNK_TOPIC) >= size
    if why is not None:
        assert str(maximum) in why and str(expected) in why


def test_a_broker_that_takes_no_chunk_says_what_to_do() -> None:
    with pytest.raises(ValueError, match="fleet push --url"):
        fit_chunk_size(None, BrokerLimits(maximum_packet_size=600), CHUNK_TOPIC)
