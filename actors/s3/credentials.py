"""The S3 worker's credentials: static keys from the config, else botocore's credential chain.

>>> source = CredentialSource(cfg.s3)
>>> source.current()        # blocking (STS, metadata): called in a thread by the process
Credentials(access_key_id=Secret('***'), ...)   # or None: no credentials, unsigned

Nothing here is hand-written credential logic: with ``s3.access_key_id`` and
``s3.secret_access_key`` empty, :func:`resolve_chain` asks botocore's default chain (in
botocore's order: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``,
a profile's ``role_arn``, web identity (``AWS_WEB_IDENTITY_TOKEN_FILE`` +
``AWS_ROLE_ARN``), SSO, the shared credentials file, ``credential_process``, the config
file, container credentials (ECS / EKS Pod Identity), instance metadata (IMDS)).
``s3.profile`` names the profile of the shared files (naming one skips the environment
keys, as botocore does). Temporary credentials come back as botocore's
``RefreshableCredentials``: :meth:`CredentialSource.current` returns the keys in force,
and botocore fetches new ones once fewer than 15 minutes are left (10 minutes: it must);
the process module asks every :data:`~actors.s3.process.REFRESH_INTERVAL` and hands
changed keys to the running worker over its pipe.

A failure to get credentials is a :class:`CredentialsUnavailable` carrying the outcome the
HEADs it blocks answer: a :class:`Fault` when retrying cannot help (unknown profile, a
partial key pair, a 4xx from STS such as a role that does not trust the token), else a
:class:`Transient` (STS or the metadata service unreachable). Its message names the
exception class only: botocore's messages can quote a file or a role, never a secret,
but nothing here needs them.

What cancellation does: nothing to clean up; the thread calling :meth:`current` may be
abandoned and finishes on its own.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from actors.s3.objectstore import Fault, Transient
from actors.s3.wire import Credentials
from supervision.config import S3Config
from supervision.errors import InfrastructureError
from supervision.secrets import Secret
from supervision.tree.backoff import Backoff

if TYPE_CHECKING:
    import botocore.credentials

# botocore (~60-90 ms of imports) loads only when its chain is asked (no static keys) or
# one of its failures is classified: a daemon with static keys never imports it


class CredentialsUnavailable(InfrastructureError):
    """The S3 credentials could not be obtained."""

    def __init__(self, outcome: Fault | Transient, repeated: bool = False) -> None:
        super().__init__(outcome.error)
        self.outcome = outcome
        self.repeated = repeated  # the last failure again, within its back-off: not news


@attrs.frozen
class StaticKeys:
    """The config's own key pair: never refreshed, so they are their own frozen copy (the
    one method of botocore's credentials :meth:`CredentialSource.current` calls)."""

    access_key: str = attrs.field(repr=False)
    secret_key: str = attrs.field(repr=False)
    token: str | None = None

    def get_frozen_credentials(self) -> StaticKeys:
        return self


def resolve_chain(cfg: S3Config) -> StaticKeys | botocore.credentials.Credentials | None:
    """The static keys of *cfg*, else what botocore's default chain finds (None: none)."""
    if cfg.access_key_id and cfg.secret_access_key:
        return StaticKeys(cfg.access_key_id.reveal(), cfg.secret_access_key.reveal())
    import botocore.session  # the chain only: see the imports

    session = botocore.session.Session(profile=cfg.profile or None)
    return session.get_credentials()


def classify_failure(exc: Exception) -> Fault | Transient:
    """The outcome a credentials failure gives the HEADs it blocks."""
    import botocore.exceptions  # a failure to classify: see the imports

    # botocore exceptions that mean the credential settings themselves are wrong
    permanent = (
        botocore.exceptions.ProfileNotFound,
        botocore.exceptions.PartialCredentialsError,
        botocore.exceptions.InvalidConfigError,
        botocore.exceptions.UnknownCredentialError,
    )
    name = type(exc).__name__
    if isinstance(exc, permanent):
        return Fault(f"credentials_invalid:{name}")
    if isinstance(exc, botocore.exceptions.ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        code = exc.response.get("Error", {}).get("Code", name)
        if 400 <= status < 500:
            return Fault(f"credentials_refused:{code}")
        return Transient(f"credentials_unavailable:{code}")
    if isinstance(exc, RuntimeError):  # botocore: "refreshed ... still expired"
        return Transient("credentials_unavailable:expired_after_refresh")
    return Transient(f"credentials_unavailable:{name}")


BACKOFF_BASE = 1.0  # the top of the window before the first retry of a failed resolution
BACKOFF_CAP = 60.0  # the longest wait between two resolutions
BACKOFF = Backoff(base=BACKOFF_BASE, cap=BACKOFF_CAP)


def _metadata_enabled() -> bool:
    """Whether botocore's chain asks the instance metadata service (it does unless
    ``AWS_EC2_METADATA_DISABLED=true``)."""
    return os.environ.get("AWS_EC2_METADATA_DISABLED", "").strip().lower() != "true"


@attrs.define
class CredentialSource:
    """The daemon's S3 credentials, resolved on first use and refreshed by botocore.

    Nothing found while the metadata service is enabled is not settled: it is what an
    IMDS outage looks like (botocore's provider then returns nothing), so it is a
    :class:`Transient` (``credentials_unavailable:none_found``) and the chain is asked
    again later; only with ``AWS_EC2_METADATA_DISABLED=true`` does an empty chain mean
    unsigned requests. A failed resolution or refresh — botocore's plain ``RuntimeError``
    for a refresh whose keys are still expired included — is retried after a full-jitter
    back-off (a draw from a window of :data:`BACKOFF_BASE` doubling to :data:`BACKOFF_CAP`);
    until then the same outcome is raised without asking again."""

    cfg: S3Config
    resolver: Callable[[S3Config], Any] = resolve_chain
    clock: Callable[[], float] = time.monotonic
    _resolved: Any = attrs.field(default=None, init=False)
    _done: bool = attrs.field(default=False, init=False)
    _failures: int = attrs.field(default=0, init=False)
    _retry_at: float = attrs.field(default=-math.inf, init=False)
    _last_failure: CredentialsUnavailable | None = attrs.field(default=None, init=False)

    def current(self) -> Credentials | None:
        """The keys to sign with now (blocking); raises :class:`CredentialsUnavailable`."""
        if self._last_failure is not None and self.clock() < self._retry_at:
            raise CredentialsUnavailable(self._last_failure.outcome, repeated=True)
        try:
            if not self._done:
                resolved = self.resolver(self.cfg)
                if resolved is None and _metadata_enabled() and not self._static():
                    raise _NothingFound
                self._resolved, self._done = resolved, True
            frozen = (None if self._resolved is None
                      else self._resolved.get_frozen_credentials())
        except _NothingFound:
            raise self._failed(Transient("credentials_unavailable:none_found")) from None
        except Exception as exc:  # RuntimeError of a refresh still expired too
            raise self._failed(classify_failure(exc)) from None
        self._failures, self._last_failure = 0, None
        if frozen is None:
            return None
        return Credentials(Secret(frozen.access_key), Secret(frozen.secret_key),
                           Secret(frozen.token or ""))

    def _static(self) -> bool:
        return bool(self.cfg.access_key_id and self.cfg.secret_access_key)

    def _failed(self, outcome: Fault | Transient) -> CredentialsUnavailable:
        self._failures += 1
        delay = BACKOFF.delay(self._failures - 1)
        self._retry_at = self.clock() + delay
        self._last_failure = CredentialsUnavailable(outcome)
        return self._last_failure

    @property
    def refreshable(self) -> bool:
        """True when the keys expire and botocore renews them (checked after resolving)."""
        if self._resolved is None or isinstance(self._resolved, StaticKeys):
            return False
        import botocore.credentials  # loaded already: the chain resolved these keys

        return isinstance(self._resolved, botocore.credentials.RefreshableCredentials)


class _NothingFound(Exception):
    """The chain found nothing while the metadata service may just be down."""
