"""Secrets at rest (e.g. an external app's auth header), encrypted with a key derived from
AGENTLOOP_SECRET_KEY."""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken


def _fernet(secret_key: str) -> Fernet:
    return Fernet(base64.urlsafe_b64encode(hashlib.sha256(secret_key.encode()).digest()))


def encrypt(value: str, secret_key: str) -> str:
    return _fernet(secret_key).encrypt(value.encode()).decode()


def decrypt(token: str, secret_key: str) -> str:
    try:
        return _fernet(secret_key).decrypt(token.encode()).decode()
    except InvalidToken:
        raise ValueError(
            "stored secret cannot be decrypted: AGENTLOOP_SECRET_KEY changed since it was stored"
        ) from None
