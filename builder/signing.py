"""DSSE envelopes signed with a key the user gives, and verified against the public keys a user trusts.

An attestation build-image signs is a DSSE v1 envelope (``application/vnd.dsse.envelope.v1+json``):
``{"payloadType", "payload": base64, "signatures": [{"keyid": "", "sig": base64}]}``, the signature over
DSSE's pre-authentication encoding (:func:`pae`) -- what ``cosign attest --key`` writes and what
``cosign verify-attestation --key`` and Kyverno's ``verifyImages.attestations`` verify (docs/cutover.md).
The ``keyid`` is left empty as cosign leaves it (a verifier that derives a key id of its own then never
skips the key); the signer's fingerprint travels beside the envelope as a claim, and only a signature
that verifies against a trusted key counts.

Keys: ECDSA P-256 (signed with SHA-256, DER signatures, as cosign's default) or Ed25519, PEM (PKCS#8 or
the traditional EC form; an encrypted one with its passphrase in ``BUILD_IMAGE_SIGN_KEY_PASSPHRASE``).  A
key's fingerprint is ``sha256:`` and the hex sha256 of its DER SubjectPublicKeyInfo (``openssl pkey -pubin
-outform DER | sha256sum``).  A private key's bytes and passphrase never reach a message, a log or a file.

:class:`Signer` is what signs: :class:`KeySigner` holds a key file's key; a signer that is not a key file
(PKCS#11, a KMS, keyless Fulcio/Rekor) implements the same two members and is not provided here yet.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from builder.errors import BadInput
from builder.validate import load_typed_json, read_bounded

ENVELOPE_TYPE = "application/vnd.dsse.envelope.v1+json"
INTOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
PASSPHRASE_ENV = "BUILD_IMAGE_SIGN_KEY_PASSPHRASE"
MAX_KEY_BYTES = 64 << 10
MAX_ENVELOPE_BYTES = 4 << 20

#: A DSSE envelope as a reader takes one (:func:`open_envelope`).
ENVELOPE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "payloadType": {"type": "string", "maxLength": 255},
        "payload": {"type": "string", "maxLength": MAX_ENVELOPE_BYTES},
        "signatures": {
            "type": "array",
            "maxItems": 16,
            "items": {
                "type": "object",
                "properties": {
                    "keyid": {"type": "string", "maxLength": 512},
                    "sig": {"type": "string", "maxLength": 4096},
                },
                "required": ["sig"],
            },
        },
    },
    "required": ["payloadType", "payload", "signatures"],
}


def pae(payload_type: str, payload: bytes) -> bytes:
    """Pure: DSSE v1's pre-authentication encoding, the bytes a signature is over."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def fingerprint(public_key) -> str:
    """``sha256:<hex>`` of the key's DER SubjectPublicKeyInfo."""
    from cryptography.hazmat.primitives import serialization

    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def public_pem(public_key) -> str:
    from cryptography.hazmat.primitives import serialization

    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


class Signer(Protocol):
    """What signs an envelope: its public key's fingerprint and a signature over bytes."""

    @property
    def fingerprint(self) -> str: ...

    def sign(self, data: bytes) -> bytes: ...


def _supported(key, what: str, path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    if isinstance(key, (ed25519.Ed25519PrivateKey, ed25519.Ed25519PublicKey)):
        return
    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)) and key.curve.name == "secp256r1":
        return
    kind = type(key).__name__.lstrip("_").replace("PrivateKey", "").replace("PublicKey", "")
    curve = getattr(getattr(key, "curve", None), "name", None)
    raise BadInput(
        f"{what} {path}: a {kind}{f' ({curve})' if curve else ''} key; build-image signs and verifies with "
        "ECDSA P-256 or Ed25519 keys only.",
        hint="make one with `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out KEY` "
        "(or `-algorithm ed25519`).",
    )


@dataclass(frozen=True)
class KeySigner:
    """A private key read from a file (ECDSA P-256 or Ed25519)."""

    key: Any
    path: str

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.key.public_key())

    def sign(self, data: bytes) -> bytes:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        if isinstance(self.key, ec.EllipticCurvePrivateKey):
            return self.key.sign(data, ec.ECDSA(hashes.SHA256()))
        return self.key.sign(data)

    def __repr__(self) -> str:  # never the key
        return f"KeySigner({self.path}, {self.fingerprint})"


def load_signer(path: str | os.PathLike, what: str = "--sign-key") -> KeySigner:
    """The private key in ``path``: a regular file only its owner can read (mode 0600 or stricter), PEM, an
    ECDSA P-256 or Ed25519 private key, decrypted with ``$BUILD_IMAGE_SIGN_KEY_PASSPHRASE`` when encrypted.
    Anything else is BadInput naming the file and what is wrong, never its content."""
    from cryptography.hazmat.primitives import serialization

    p = Path(path)
    data = read_bounded(p, what, max_bytes=MAX_KEY_BYTES)
    if b"PRIVATE KEY" not in data and b"PUBLIC KEY" in data:
        raise BadInput(
            f"{what} {p} holds a public key; signing needs the private key (the public key goes to "
            "[serving] trusted_keys or --trusted-key of whoever verifies)."
        )
    mode = stat.S_IMODE(os.stat(p).st_mode)
    if mode & 0o077:
        raise BadInput(
            f"{what} {p}: the private key is readable by others (mode {mode:04o}); a signing key must be "
            "readable by its owner only.",
            hint=f"chmod 600 {p}",
        )
    passphrase = os.environ.get(PASSPHRASE_ENV)
    try:
        key = serialization.load_pem_private_key(data, password=passphrase.encode() if passphrase else None)
    except TypeError:
        raise BadInput(
            f"{what} {p}: the private key is encrypted "
            + ("but no passphrase was given" if not passphrase else "and does not take that passphrase")
            + f"; set {PASSPHRASE_ENV}.",
        ) from None
    except (ValueError, binascii.Error) as exc:
        why = "the passphrase does not open it" if passphrase and "decrypt" in str(exc).lower() else "not a PEM key"
        raise BadInput(
            f"{what} {p} is not a private key build-image can read ({why}): a PEM ECDSA P-256 or Ed25519 "
            "private key is expected."
        ) from None
    _supported(key, what, p)
    return KeySigner(key=key, path=str(p))


def load_public_key(path: str | os.PathLike, what: str = "--trusted-key"):
    """The public key in ``path`` (PEM SubjectPublicKeyInfo, as ``cosign public-key`` or ``openssl pkey
    -pubout`` writes it): ECDSA P-256 or Ed25519.  A private key there is refused (it is never needed to
    verify, and a trusted-keys list is shared)."""
    from cryptography.hazmat.primitives import serialization

    p = Path(path)
    data = read_bounded(p, what, max_bytes=MAX_KEY_BYTES)
    if b"PRIVATE KEY" in data:
        raise BadInput(
            f"{what} {p} holds a private key; verification takes the public key only "
            "(`openssl pkey -in KEY -pubout`); keep the private key to the signer."
        )
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, binascii.Error):
        raise BadInput(f"{what} {p} is not a PEM public key (-----BEGIN PUBLIC KEY-----).") from None
    _supported(key, what, p)
    return key


def trusted_keys(paths: list[str | os.PathLike], what: str = "trusted key") -> dict[str, Any]:
    """Fingerprint -> public key of every file in ``paths``."""
    keys = {}
    for path in paths:
        key = load_public_key(path, what)
        keys[fingerprint(key)] = key
    return keys


def sign_envelope(payload: bytes, signer: Signer, payload_type: str = INTOTO_PAYLOAD_TYPE) -> bytes:
    """The DSSE envelope of ``payload`` signed by ``signer`` (compact JSON)."""
    sig = signer.sign(pae(payload_type, payload))
    env = {
        "payloadType": payload_type,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [{"keyid": "", "sig": base64.b64encode(sig).decode()}],
    }
    return json.dumps(env, separators=(",", ":")).encode()


def _verifies(key, signature: bytes, data: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        else:
            key.verify(signature, data)
    except (InvalidSignature, ValueError):
        return False
    return True


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise BadInput(f"{what} is not base64.") from None


@dataclass(frozen=True)
class Opened:
    """An envelope read: its payload, and the fingerprints of the trusted keys whose signature verified."""

    payload: bytes
    payload_type: str
    signers: tuple[str, ...]
    signatures: int


def open_envelope(blob: bytes, where: str, trusted: dict[str, Any], payload_type: str = INTOTO_PAYLOAD_TYPE) -> Opened:
    """The envelope in ``blob`` read by :data:`ENVELOPE_SCHEMA`, of ``payload_type``, each signature checked
    against every key in ``trusted`` over the payload's PAE.  A malformed envelope is BadInput naming
    ``where``; one no trusted key signed comes back with no signers (the caller refuses it by name)."""
    if len(blob) > MAX_ENVELOPE_BYTES:
        raise BadInput(f"{where}: the DSSE envelope is {len(blob)} bytes, more than one can be.")
    env = load_typed_json(blob, f"{where}: the DSSE envelope", ENVELOPE_SCHEMA)
    if env["payloadType"] != payload_type:
        raise BadInput(f"{where}: the DSSE envelope's payloadType is {env['payloadType']!r:.80}, not {payload_type}.")
    payload = _b64(env["payload"], f"{where}: the DSSE payload")
    signed = pae(payload_type, payload)
    signers = []
    for s in env["signatures"]:
        sig = _b64(s["sig"], f"{where}: a DSSE signature")
        signers += [fp for fp, key in trusted.items() if fp not in signers and _verifies(key, sig, signed)]
    return Opened(payload, payload_type, tuple(signers), len(env["signatures"]))
