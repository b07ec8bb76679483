"""What a broker accepts, as it says in its CONNACK (MQTT 5), and the chunk size that fits it.

`BrokerLimits` is the typed form of the CONNACK's properties (`agent/mqtt/link.py` fills it at
every connect). A broker closes the connection of a client that sends a packet larger than its
Maximum Packet Size, so the link never sends one (`publish_packet_size` is the exact size of a
PUBLISH packet) and the push cuts bundles into chunks that fit (`fit_chunk_size`). Pure values
and functions: no I/O, no threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.mqtt.protocol import DEFAULT_CHUNK_SIZE

#: chunk sizes chosen to fit a broker are whole KiB
CHUNK_UNIT = 1024


@dataclass(frozen=True)
class BrokerLimits:
    """What the broker announced in its CONNACK (MQTT 5 properties); None where it set no limit.

    `maximum_packet_size` is in bytes of a whole MQTT packet (header, topic and properties
    included); `receive_maximum` is how many QoS 1 messages it takes unacknowledged.
    """

    maximum_packet_size: int | None = None
    receive_maximum: int | None = None
    maximum_qos: int = 2
    retain_available: bool = True
    wildcard_subscriptions: bool = True

    @classmethod
    def from_connack(cls, properties: Any) -> BrokerLimits:
        """From paho's CONNACK properties (absent ones are the MQTT 5 defaults)."""
        return cls(
            maximum_packet_size=getattr(properties, "MaximumPacketSize", None),
            receive_maximum=getattr(properties, "ReceiveMaximum", None),
            maximum_qos=getattr(properties, "MaximumQoS", 2),
            retain_available=bool(getattr(properties, "RetainAvailable", 1)),
            wildcard_subscriptions=bool(getattr(properties, "WildcardSubscriptionAvailable", 1)),
        )

    def fits(self, packet_size: int) -> bool:
        return self.maximum_packet_size is None or packet_size <= self.maximum_packet_size


def _varint_size(value: int) -> int:
    """Bytes of an MQTT variable byte integer."""
    size = 1
    while value >= 128:
        value //= 128
        size += 1
    return size


def publish_packet_size(topic: str, payload: int, qos: int = 1, properties_field: int = 1) -> int:
    """Bytes of an MQTT 5 PUBLISH packet carrying `payload` bytes on `topic`, whose properties
    field (their length and the properties) takes `properties_field` bytes (1: none). This is
    what a broker's Maximum Packet Size is compared with."""
    remaining = 2 + len(topic.encode()) + (2 if qos else 0) + properties_field + payload
    return 1 + _varint_size(remaining) + remaining


def largest_payload(maximum_packet_size: int, topic: str, qos: int = 1) -> int:
    """The most payload bytes a QoS `qos` PUBLISH on `topic` (no properties) may carry within
    `maximum_packet_size` bytes; below 0 when not even the empty packet fits."""
    payload = maximum_packet_size - publish_packet_size(topic, 0, qos)
    while payload > 0 and publish_packet_size(topic, payload, qos) > maximum_packet_size:
        payload -= 1  # the remaining length took one more byte than the empty packet's
    return payload


def fit_chunk_size(requested: int | None, limits: BrokerLimits | None, longest_topic: str) -> tuple[int, str | None]:
    """The chunk size to push and, when it is not what was asked for, why (for the operator).

    `requested` (None: `DEFAULT_CHUNK_SIZE`) when a chunk of it on `longest_topic` fits the
    broker's Maximum Packet Size, else the largest whole KiB that fits. Raises `ValueError` when
    the broker does not take even 1 KiB chunks (push with --url then)."""
    wanted = requested or DEFAULT_CHUNK_SIZE
    if limits is None or limits.maximum_packet_size is None:
        return wanted, None
    room = largest_payload(limits.maximum_packet_size, longest_topic)
    if wanted <= room:
        return wanted, None
    fitted = room // CHUNK_UNIT * CHUNK_UNIT
    if fitted < CHUNK_UNIT:
        raise ValueError(
            f"the broker's maximum packet size ({limits.maximum_packet_size} bytes) leaves no room for a 1 KiB "
            "chunk; serve the bundle over HTTP (fleet push --url)"
        )
    why = (
        f"chunks of {wanted} bytes would exceed the broker's maximum packet size "
        f"({limits.maximum_packet_size} bytes): using {fitted}-byte chunks"
    )
    return fitted, why
