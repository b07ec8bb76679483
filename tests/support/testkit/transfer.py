"""What the transfer tests share: a bundle's worth of bytes and a link to a test broker."""

from __future__ import annotations

import os

from agent.config.models import MqttSection
from agent.mqtt.link import MqttLink

DATA = os.urandom(100_000)


def link_to(url: str, **settings: object) -> MqttLink:
    link = MqttLink(MqttSection(broker=url, reconnect_min_s=0.1, reconnect_max_s=0.3, **settings), "test-link")
    return link
