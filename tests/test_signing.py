"""DSSE signing and verification (builder/signing.py): the envelope cosign writes, key files refused by name,
and no private key in any message."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from builder import signing
from builder.errors import BadInput
from tests.fx_cutover import make_key
from tests.test_fuzz import invoke

PAYLOAD = b'{"_type":"https://in-toto.io/Statement/v1"}'


@pytest.mark.parametrize("kind", ["ec", "ed25519"])
def test_an_envelope_is_dsse_v1_and_verifies_only_against_its_key(tmp_path, kind):
    priv, pub = make_key(tmp_path, kind)
    signer = signing.load_signer(priv)
    env = json.loads(signing.sign_envelope(PAYLOAD, signer))
    # the layout cosign writes: base64 payload, the signature over DSSE's PAE, an empty keyid
    assert env["payloadType"] == "application/vnd.in-toto+json"
    assert base64.b64decode(env["payload"]) == PAYLOAD and env["signatures"][0]["keyid"] == ""
    pae = b"DSSEv1 28 application/vnd.in-toto+json %d %s" % (len(PAYLOAD), PAYLOAD)
    assert signing.pae(signing.INTOTO_PAYLOAD_TYPE, PAYLOAD) == pae
    trusted = signing.trusted_keys([pub])
    opened = signing.open_envelope(json.dumps(env).encode(), "t", trusted)
    assert opened.payload == PAYLOAD and opened.signers == (signer.fingerprint,)
    # the fingerprint is the sha256 of the DER SubjectPublicKeyInfo
    der = base64.b64decode("".join(pub.read_text().splitlines()[1:-1]))
    assert signer.fingerprint == "sha256:" + hashlib.sha256(der).hexdigest()
    _, other = make_key(tmp_path, kind)
    assert signing.open_envelope(json.dumps(env).encode(), "t", signing.trusted_keys([other])).signers == ()


def test_a_flipped_byte_in_the_payload_or_the_signature_verifies_against_no_key(tmp_path):
    priv, pub = make_key(tmp_path)
    env = json.loads(signing.sign_envelope(PAYLOAD, signing.load_signer(priv)))
    trusted = signing.trusted_keys([pub])
    for holder, field in ((env, "payload"), (env["signatures"][0], "sig")):
        raw = bytearray(base64.b64decode(holder[field]))
        raw[3] ^= 1
        saved, holder[field] = holder[field], base64.b64encode(bytes(raw)).decode()
        assert signing.open_envelope(json.dumps(env).encode(), "t", trusted).signers == ()
        holder[field] = saved
    env["payloadType"] = "text/plain"
    with pytest.raises(BadInput, match="payloadType"):
        signing.open_envelope(json.dumps(env).encode(), "t", trusted)


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda d: make_key(d)[1], "holds a public key"),
        (lambda d: make_key(d, password=b"pw")[0], "encrypted but no passphrase was given"),
        (lambda d: _chmod(make_key(d)[0], 0o644), "readable by others (mode 0644)"),
        (
            lambda d: _write(d / "junk.key", b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"),
            "not a private key",
        ),
        (lambda d: _rsa(d), "a RSA key"),
        (lambda d: d, "not a regular file"),
    ],
)
def test_a_sign_key_that_cannot_sign_is_exit_2_naming_it_never_its_content(tmp_path, make, says):
    path = make(tmp_path)
    content = path.read_bytes() if path.is_file() else b""
    with pytest.raises(BadInput) as exc:
        signing.load_signer(path)
    assert str(path) in exc.value.message and says in exc.value.message, exc.value.message
    if content:
        body = b"".join(content.splitlines()[1:-1]).decode()
        assert body[:40] not in exc.value.message + (exc.value.hint or "")
    ref = "127.0.0.1:9/x/app@sha256:" + "a" * 64
    code, out, _ = invoke("smoke", ref, "--model", str(tmp_path), "--attest", "--sign-key", str(path))
    cli_says = "is a directory" if path.is_dir() else says.split(" (")[0]  # click refuses a directory itself
    assert code == 2 and cli_says in out.replace("\n", " ")
    assert not content or content.splitlines()[1].decode()[:30] not in out


def test_an_encrypted_key_opens_with_its_passphrase_only(tmp_path, monkeypatch):
    priv, _ = make_key(tmp_path, password=b"s3cret-pass")
    monkeypatch.setenv(signing.PASSPHRASE_ENV, "wrong")
    with pytest.raises(BadInput) as exc:
        signing.load_signer(priv)
    assert "wrong" not in exc.value.message and "s3cret" not in exc.value.message
    monkeypatch.setenv(signing.PASSPHRASE_ENV, "s3cret-pass")
    assert signing.load_signer(priv).fingerprint.startswith("sha256:")
    assert "s3cret" not in repr(signing.load_signer(priv)) and "PRIVATE" not in repr(signing.load_signer(priv))


def test_a_private_key_given_as_a_trusted_key_is_refused(tmp_path):
    priv, _ = make_key(tmp_path)
    with pytest.raises(BadInput, match="holds a private key; verification takes the public key only"):
        signing.load_public_key(priv)


def _chmod(path, mode):
    path.chmod(mode)
    return path


def _write(path, data):
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def _rsa(folder):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return _write(folder / "rsa.key", pem)
