"""`agent.mqtt.enrolment`: a device accepts only an answer a claim key signed for its own request
and key; a sealed password opens only with the key it was sealed to; documents are bounded."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.errors import ErrorCode
from agent.mqtt.enrolment import (
    MAX_ENROL_BYTES,
    Claim,
    DeviceKeys,
    EnrolAnswer,
    EnrolRefused,
    EnrolRequest,
    Hardware,
    accept_answer,
    check_request,
    make_request,
    pem,
    seal,
    sign_answer,
    unseal,
)

NOW = 1_800_000_000.0
OPERATOR = Ed25519PrivateKey.generate()
CLAIM = Claim(
    broker="mqtt://broker",
    claim="c",
    username="u",
    password="p",
    operator_keys=[pem(OPERATOR.public_key())],
    expires_at=NOW + 60,
)
HARDWARE = Hardware(board="b", serial="s", mac="m")


def request_and_keys(folder: Path) -> tuple[EnrolRequest, DeviceKeys]:
    keys = DeviceKeys.load_or_make(folder)
    return make_request(keys, CLAIM, "cam-1", HARDWARE, NOW), keys


def answer_to(request: EnrolRequest, key: Ed25519PrivateKey = OPERATOR) -> EnrolAnswer:
    sealed = seal("the password", request.box_key, request.request_id)
    answer = EnrolAnswer(
        request_id=request.request_id,
        device_key=request.public_key,
        approved=True,
        device_id="cam-1",
        username="cam-1",
        password=sealed,
        issued_at=NOW,
    )
    return sign_answer(answer, key)


def test_an_answer_signed_by_the_claim_s_key_for_this_request_is_accepted_and_opens(tmp_path: Path) -> None:
    request, keys = request_and_keys(tmp_path)
    answer = accept_answer(answer_to(request), request, CLAIM.public_keys())
    assert answer.password is not None and unseal(answer.password, keys.box, request.request_id) == "the password"
    assert DeviceKeys.load_or_make(tmp_path).signing.public_key() == keys.signing.public_key()  # made once


def test_answers_that_are_not_for_this_device_are_refused(tmp_path: Path) -> None:
    request, keys = request_and_keys(tmp_path)
    other, _ = request_and_keys(tmp_path / "other")
    for answer in (
        answer_to(request, Ed25519PrivateKey.generate()),  # not the claim's key
        answer_to(request).model_copy(update={"username": "cam-2"}),  # changed after signing
        answer_to(other),  # another request's
        sign_answer(answer_to(request).model_copy(update={"device_key": other.public_key}), OPERATOR),
    ):
        with pytest.raises(EnrolRefused) as refused:
            accept_answer(answer, request, CLAIM.public_keys())
        assert refused.value.code == ErrorCode.ENROL_FORGED
    sealed = answer_to(request).password
    assert sealed is not None
    with pytest.raises(EnrolRefused):  # another device's key, or the same box under another request id
        unseal(sealed, DeviceKeys.load_or_make(tmp_path / "other").box, request.request_id)
    with pytest.raises(EnrolRefused):
        unseal(sealed, keys.box, other.request_id)


def test_a_request_is_checked_against_its_topic_and_its_age(tmp_path: Path) -> None:
    request, _ = request_and_keys(tmp_path)
    check_request(request, "c", request.request_id, NOW + 100, 100, 5)
    for claim, request_id, now, code in (
        ("other", request.request_id, NOW, ErrorCode.ENROL_FORGED),
        ("c", "0" * 32, NOW, ErrorCode.ENROL_FORGED),
        ("c", request.request_id, NOW + 100.5, ErrorCode.ENROL_EXPIRED),
        ("c", request.request_id, NOW - 5.5, ErrorCode.ENROL_EXPIRED),
    ):
        with pytest.raises(EnrolRefused) as refused:
            check_request(request, claim, request_id, now, 100, 5)
        assert refused.value.code == code


def test_documents_are_bounded_before_they_are_parsed() -> None:
    with pytest.raises(EnrolRefused, match=f"more than {MAX_ENROL_BYTES}"):
        EnrolAnswer.parse(b" " * (MAX_ENROL_BYTES + 1), "an answer")
