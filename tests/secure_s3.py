"""A SeaweedFS the way clouds run S3: TLS from a private CA, an STS that issues session
credentials, virtual-hosted bucket names — for the tests and the TLS bench.

>>> with open_secure_s3(base_dir) as s3:
...     s3.https_url, s3.ca_file          # https://localhost:<port>, the throwaway CA
...     creds = s3.assume_role()          # botocore Credentials with a session token

One ``weed mini`` with its own S3 gateway options (no TLS terminator in front):
``-s3.cert.file``/``-s3.key.file``/``-s3.port.https`` serve TLS next to the plain port,
with a certificate for ``localhost``, ``127.0.0.1`` and ``<bucket>.localhost`` signed by a
``trustme`` CA; ``-s3.domainName=localhost`` makes ``<bucket>.localhost`` a
virtual-hosted bucket (libcurl resolves any ``*.localhost`` to loopback itself);
``-s3.iam.config`` turns on SeaweedFS's STS: ``AssumeRole`` (signed with the static
identity) and ``AssumeRoleWithWebIdentity`` (an ``oidc`` provider trusting
:class:`OidcIssuer`, whose JWKS a loopback HTTP server serves) return temporary
credentials whose session token SeaweedFS then requires on every request.
"""

from __future__ import annotations

import base64
import http.server
import json
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import botocore.credentials
import botocore.session
import trustme
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from supervision.dev.ports import free_ports
from supervision.dev.s3 import S3Server

ROLE_ARN = "arn:aws:iam::role/SafetynetRecordings"
OIDC_ISSUER = "https://oidc.safetynet.test"
OIDC_CLIENT = "sts.amazonaws.com"
SECURE_BUCKET = "secure-recordings"


class OidcIssuer:
    """A throwaway OpenID issuer: an RSA key, its JWKS served on loopback, signed JWTs."""

    def __init__(self) -> None:
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        numbers = self._key.public_key().public_numbers()
        jwks = {"keys": [{"kty": "RSA", "kid": "k1", "use": "sig", "alg": "RS256",
                          "n": _b64(numbers.n.to_bytes(256, "big")),
                          "e": _b64(numbers.e.to_bytes(3, "big"))}]}
        body = json.dumps(jwks).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.jwks_uri = f"http://127.0.0.1:{self._server.server_address[1]}/jwks.json"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def token(self, subject: str) -> str:
        """A JWT for *subject*, valid for an hour, signed RS256 with the served key."""
        now = int(time.time())
        head = _b64(json.dumps({"alg": "RS256", "typ": "JWT", "kid": "k1"}).encode())
        claims = _b64(json.dumps({"iss": OIDC_ISSUER, "sub": subject, "aud": OIDC_CLIENT,
                                  "iat": now, "exp": now + 3600}).encode())
        signature = self._key.sign(f"{head}.{claims}".encode(), padding.PKCS1v15(),
                                   hashes.SHA256())
        return f"{head}.{claims}.{_b64(signature)}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def iam_config(jwks_uri: str) -> dict[str, object]:
    """STS on, one role anyone (a signed caller, a web identity) may assume, all of S3."""
    trust = {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": "*",
        "Action": ["sts:AssumeRole", "sts:AssumeRoleWithWebIdentity"]}]}
    policy = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["s3:*"], "Resource": ["*"]},
        {"Effect": "Allow", "Action": ["sts:ValidateSession"], "Resource": ["*"]}]}
    return {
        "sts": {"tokenDuration": 3600 * 10**9, "maxSessionLength": 12 * 3600 * 10**9,
                "issuer": "seaweedfs-sts",
                "signingKey": base64.b64encode(secrets.token_bytes(32)).decode(),
                "providers": [{"name": "safetynet-oidc", "type": "oidc", "enabled": True,
                               "config": {"issuer": OIDC_ISSUER, "clientId": OIDC_CLIENT,
                                          "jwksUri": jwks_uri}}]},
        "policy": {"defaultEffect": "Deny", "storeType": "memory"},
        "roles": [{"roleName": "SafetynetRecordings", "roleArn": ROLE_ARN,
                   "trustPolicy": trust, "attachedPolicies": ["Recordings"]}],
        "policies": [{"name": "Recordings", "document": policy}],
    }


@attrs.define
class SecureS3:
    server: S3Server
    https_port: int
    ca_file: Path
    oidc: OidcIssuer

    @property
    def http_url(self) -> str:
        return self.server.endpoint_url

    @property
    def https_url(self) -> str:
        return f"https://localhost:{self.https_port}"

    def assume_role(self, session_name: str = "safetynet") -> botocore.credentials.Credentials:
        """Temporary credentials (key id, secret, session token) from SeaweedFS's STS."""
        c = self.server.credentials
        sts = botocore.session.get_session().create_client(
            "sts", region_name=c.region, endpoint_url=self.http_url,
            aws_access_key_id=c.access_key_id, aws_secret_access_key=c.secret_access_key)
        issued = sts.assume_role(RoleArn=ROLE_ARN, RoleSessionName=session_name)
        keys = issued["Credentials"]
        return botocore.credentials.Credentials(
            keys["AccessKeyId"], keys["SecretAccessKey"], keys["SessionToken"])


@contextmanager
def open_secure_s3(base_dir: Path) -> Iterator[SecureS3]:
    """Start the secured SeaweedFS with :data:`SECURE_BUCKET` created; always stop it."""
    base_dir.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1", f"{SECURE_BUCKET}.localhost")
    ca_file, cert_file, key_file = (base_dir / n for n in ("ca.pem", "cert.pem", "key.pem"))
    ca.cert_pem.write_to_path(str(ca_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    iam_file = base_dir / "iam.json"
    oidc = OidcIssuer()
    iam_file.write_text(json.dumps(iam_config(oidc.jwks_uri)))
    (https_port,) = free_ports(1)
    server = S3Server(base_dir, extra_flags=[
        f"-s3.cert.file={cert_file}", f"-s3.key.file={key_file}",
        f"-s3.port.https={https_port}", "-s3.domainName=localhost",
        f"-s3.iam.config={iam_file}"])
    server.start()
    try:
        server.create_bucket(SECURE_BUCKET)
        yield SecureS3(server, https_port, ca_file, oidc)
    finally:
        server.stop()
        oidc.close()
