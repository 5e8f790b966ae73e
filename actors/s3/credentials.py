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

from collections.abc import Callable
from typing import Any

import attrs
import botocore.credentials
import botocore.exceptions
import botocore.session

from actors.s3.objectstore import Fault, Transient
from actors.s3.wire import Credentials
from supervision.config import S3Config
from supervision.errors import InfrastructureError
from supervision.secrets import Secret

# botocore exceptions that mean the credential settings themselves are wrong
_PERMANENT = (
    botocore.exceptions.ProfileNotFound,
    botocore.exceptions.PartialCredentialsError,
    botocore.exceptions.InvalidConfigError,
    botocore.exceptions.UnknownCredentialError,
)


class CredentialsUnavailable(InfrastructureError):
    """The S3 credentials could not be obtained."""

    def __init__(self, outcome: Fault | Transient) -> None:
        super().__init__(outcome.error)
        self.outcome = outcome


def resolve_chain(cfg: S3Config) -> botocore.credentials.Credentials | None:
    """The static keys of *cfg*, else what botocore's default chain finds (None: none)."""
    if cfg.access_key_id and cfg.secret_access_key:
        return botocore.credentials.Credentials(
            cfg.access_key_id.reveal(), cfg.secret_access_key.reveal(), method="config")
    session = botocore.session.Session(profile=cfg.profile or None)
    return session.get_credentials()


def classify_failure(exc: Exception) -> Fault | Transient:
    """The outcome a credentials failure gives the HEADs it blocks."""
    name = type(exc).__name__
    if isinstance(exc, _PERMANENT):
        return Fault(f"credentials_invalid:{name}")
    if isinstance(exc, botocore.exceptions.ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        code = exc.response.get("Error", {}).get("Code", name)
        if 400 <= status < 500:
            return Fault(f"credentials_refused:{code}")
        return Transient(f"credentials_unavailable:{code}")
    return Transient(f"credentials_unavailable:{name}")


@attrs.define
class CredentialSource:
    """The daemon's S3 credentials, resolved on first use and refreshed by botocore."""

    cfg: S3Config
    resolver: Callable[[S3Config], Any] = resolve_chain
    _resolved: Any = attrs.field(default=None, init=False)
    _done: bool = attrs.field(default=False, init=False)

    def current(self) -> Credentials | None:
        """The keys to sign with now (blocking); raises :class:`CredentialsUnavailable`."""
        try:
            if not self._done:
                self._resolved = self.resolver(self.cfg)
                self._done = True
            if self._resolved is None:
                return None
            frozen = self._resolved.get_frozen_credentials()
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError,
                OSError) as exc:
            raise CredentialsUnavailable(classify_failure(exc)) from None
        return Credentials(Secret(frozen.access_key), Secret(frozen.secret_key),
                           Secret(frozen.token or ""))

    @property
    def refreshable(self) -> bool:
        """True when the keys expire and botocore renews them (checked after resolving)."""
        return isinstance(self._resolved, botocore.credentials.RefreshableCredentials)
