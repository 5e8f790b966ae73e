"""Kafka errors sorted by who must act: retry (transient), dead-letter (the message),
or a configuration fault (the operator) — nothing is dead-lettered for the latter."""

from __future__ import annotations

import pytest
from aiokafka import errors

from actors.kafka_producer import Delivery, classify, probe_verdict


@pytest.mark.parametrize("exc", [
    errors.TopicAuthorizationFailedError("t"), errors.ClusterAuthorizationFailedError(),
    errors.SaslAuthenticationFailed(), errors.AuthenticationFailedError(),
    errors.UnsupportedSaslMechanismError(), errors.IllegalSaslStateError(),
    errors.AuthenticationMethodNotSupported(),
])
def test_authorization_and_sasl_errors_are_configuration_faults(exc: Exception) -> None:
    """The broker refuses us: not the row's fault, never a dead letter."""
    assert classify(exc) is Delivery.FAULT


@pytest.mark.parametrize("exc", [errors.MessageSizeTooLargeError(),
                                 errors.InvalidTopicError()])
def test_a_message_the_broker_can_never_take_is_rejected(exc: Exception) -> None:
    assert classify(exc) is Delivery.REJECTED


@pytest.mark.parametrize("exc", [
    errors.KafkaTimeoutError(), errors.KafkaConnectionError(), errors.NotLeaderForPartitionError(),
    errors.RequestTimedOutError(),
    # after aiokafka's metadata wait timed out: a dead broker gives it too
    errors.UnknownTopicOrPartitionError(),
])
def test_infrastructure_errors_are_transient(exc: Exception) -> None:
    assert classify(exc) is Delivery.TRANSIENT


@pytest.mark.parametrize(("code", "delivery"), [
    (0, None),  # the topic exists
    (5, None),  # LEADER_NOT_AVAILABLE: being created, the send waits for it
    (3, Delivery.FAULT),  # UNKNOWN_TOPIC_OR_PARTITION from the broker: auto-create off
    (29, Delivery.FAULT),  # TOPIC_AUTHORIZATION_FAILED
    (31, Delivery.FAULT),  # CLUSTER_AUTHORIZATION_FAILED
    (17, Delivery.REJECTED),  # INVALID_TOPIC_EXCEPTION
    (7, Delivery.TRANSIENT),  # REQUEST_TIMED_OUT
])
def test_topic_probe_answer_decides_before_any_send(code: int,
                                                   delivery: Delivery | None) -> None:
    """The broker's own answer to the Metadata probe is unambiguous, unlike a timeout."""
    assert probe_verdict(code) is delivery
