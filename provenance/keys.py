"""Ed25519 signing and verifying keys, named by a key id (sha256 of the raw public key)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from shardport.provenance.errors import KeyFormatError


def _keyid(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:32]


@dataclass(frozen=True)
class VerifyingKey:
    """A public key that verifies signatures."""

    public: Ed25519PublicKey
    keyid: str

    @classmethod
    def from_pem(cls, pem: bytes, *, source: str = "public key") -> VerifyingKey:
        """Load a PEM (SubjectPublicKeyInfo) Ed25519 public key."""
        try:
            key = serialization.load_pem_public_key(pem)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise KeyFormatError(f"{source}: not a PEM public key ({exc})") from exc
        if not isinstance(key, Ed25519PublicKey):
            raise KeyFormatError(f"{source}: expected an Ed25519 key, found {type(key).__name__}")
        return cls(public=key, keyid=_keyid(key))

    def to_pem(self) -> bytes:
        """PEM (SubjectPublicKeyInfo) bytes."""
        return self.public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def verify(self, signature: bytes, message: bytes) -> bool:
        """True when ``signature`` is this key's signature of ``message``."""
        try:
            self.public.verify(signature, message)
        except InvalidSignature:
            return False
        return True


@dataclass(frozen=True)
class SigningKey:
    """A private key that signs."""

    private: Ed25519PrivateKey
    keyid: str

    @classmethod
    def generate(cls) -> SigningKey:
        """A fresh random key."""
        private = Ed25519PrivateKey.generate()
        return cls(private=private, keyid=_keyid(private.public_key()))

    @classmethod
    def from_pem(cls, pem: bytes, *, source: str = "private key") -> SigningKey:
        """Load an unencrypted PKCS#8 PEM Ed25519 private key."""
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise KeyFormatError(f"{source}: not an unencrypted PEM private key ({exc})") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyFormatError(f"{source}: expected an Ed25519 key, found {type(key).__name__}")
        return cls(private=key, keyid=_keyid(key.public_key()))

    @classmethod
    def load(cls, path: Path) -> SigningKey:
        """Load from a file."""
        try:
            pem = path.read_bytes()
        except OSError as exc:
            raise KeyFormatError(f"cannot read signing key {path}: {exc.strerror}") from exc
        return cls.from_pem(pem, source=str(path))

    def to_pem(self) -> bytes:
        """PKCS#8 PEM bytes (unencrypted: protect the file with permissions)."""
        return self.private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def verifying_key(self) -> VerifyingKey:
        """The matching public key."""
        return VerifyingKey(public=self.private.public_key(), keyid=self.keyid)

    def sign(self, message: bytes) -> bytes:
        """Ed25519 signature of ``message``."""
        return self.private.sign(message)

    def save(self, private_path: Path, public_path: Path) -> None:
        """Write the key pair; the private key file is created 0600 and never overwritten."""
        private_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(self.to_pem())
        public_path.write_bytes(self.verifying_key().to_pem())
