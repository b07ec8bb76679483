"""`agent.mqtt.limits`: PUBLISH packet sizes as paho writes them on the wire, and chunks that fit
the broker's maximum packet size."""

from __future__ import annotations

import socket

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.mqtt.limits import BrokerLimits, fit_chunk_size, largest_payload, publish_packet_size
from agent.mqtt.protocol import Topics

CHUNK_TOPIC = Topics().chunk("f" * 64, 65536)
#: an MQTT 5 CONNACK: session not present, success, no properties
CONNACK = b"\x20\x03\x00\x00\x00"
#: an MQTT 5 DISCONNECT without a reason code, as paho sends it last
DISCONNECT = b"\xe0\x00"


def wire_publish(topic: str, payload: bytes, qos: int = 1, properties: Properties | None = None) -> bytes:
    """The bytes of the PUBLISH packet paho writes for `payload` on `topic`: a real paho client
    (MQTT 5, its public API) publishes to a stand-in broker, a listening socket that answers its
    CONNECT with `CONNACK` and records what comes next, up to paho's DISCONNECT. A stand-in,
    because mosquitto cannot say how many bytes a packet had (it counts them its own way)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
        client.connect("127.0.0.1", server.getsockname()[1])
        conn, _ = server.accept()
        with conn:
            conn.settimeout(10)
            conn.recv(1 << 16)  # the CONNECT
            conn.sendall(CONNACK)
            for _ in range(10):
                if client.is_connected():
                    break
                client.loop(1)
            assert client.is_connected(), "paho took the CONNACK"
            assert client.publish(topic, payload, qos=qos, properties=properties).rc == MQTTErrorCode.MQTT_ERR_SUCCESS
            client.disconnect()  # written and the socket closed: what follows the PUBLISH, then the end
            data = bytearray()
            while piece := conn.recv(1 << 20):
                data += piece
    assert data.endswith(DISCONNECT) and data[0] >> 4 == 3, "a PUBLISH, then the DISCONNECT"
    return bytes(data[: -len(DISCONNECT)])


def _properties() -> Properties:
    """A command's answer's properties (`agent.mqtt.link`'s `reply`)."""
    properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]  # paho is untyped
    properties.ContentType = "application/json"
    properties.CorrelationData = b"\x01" * 16
    properties.ResponseTopic = "edge/replies/operator-1"
    return properties


#: payload sizes on each side of the remaining length's steps (127 | 128, 16383 | 16384 bytes)
#: for each topic and QoS: remaining = 2 + topic + (2 for QoS 1's packet id) + 1 (no properties) + payload
STEPS = [
    pytest.param(topic, qos, remaining - (2 + len(topic) + 2 * qos + 1), id=f"{name}-qos{qos}-{remaining}")
    for name, topic in (("short", "t"), ("chunk", CHUNK_TOPIC))
    for qos in (0, 1)
    for remaining in (127, 128, 16383, 16384)
    if remaining - (2 + len(topic) + 2 * qos + 1) >= 0
]


@pytest.mark.parametrize(("topic", "qos", "payload"), STEPS)
def test_the_packet_size_is_what_paho_writes(topic: str, qos: int, payload: int) -> None:
    """`publish_packet_size` against the bytes paho sends, at each step of the remaining length's
    variable byte integer and at both QoS. Catches a planted `> 128` in `_varint_size` (a
    remaining length of exactly 128 counted in one byte) and the 2-byte packet id of QoS 1 left
    out: the size was only ever checked against itself."""
    assert publish_packet_size(topic, payload, qos) == len(wire_publish(topic, b"x" * payload, qos))


def test_the_packet_size_with_properties_is_what_paho_writes() -> None:
    """With an answer's properties (the link passes their packed length)."""
    properties = _properties()
    packed = len(properties.pack())  # type: ignore[no-untyped-call]  # paho is untyped
    for payload in (0, 100, 20_000):
        wire = wire_publish("edge/replies/operator-1", b"x" * payload, 1, properties)
        assert publish_packet_size("edge/replies/operator-1", payload, 1, packed) == len(wire)


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
    """The chunk size, and the largest payload, measured on paho's packets, not on the size
    formula itself: the largest payload's packet is at most the maximum and one byte more is
    over it; a changed chunk size is the largest whole KiB under it."""
    size, why = fit_chunk_size(requested, BrokerLimits(maximum_packet_size=maximum), CHUNK_TOPIC)
    assert size == expected and (why is not None) == changed
    if maximum is not None and maximum < 1 << 20:  # the wire checks for the limits a broker sets
        room = largest_payload(maximum, CHUNK_TOPIC)
        largest, over = (len(wire_publish(CHUNK_TOPIC, b"x" * n)) for n in (room, room + 1))
        assert largest <= maximum < over
        assert size <= room and (not changed or size + 1024 > room)
    if why is not None:
        assert str(maximum) in why and str(expected) in why


def test_a_broker_that_takes_no_chunk_says_what_to_do() -> None:
    with pytest.raises(ValueError, match="fleet push --url"):
        fit_chunk_size(None, BrokerLimits(maximum_packet_size=600), CHUNK_TOPIC)
