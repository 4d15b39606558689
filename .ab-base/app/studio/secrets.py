"""API keys (OpenRouter, Hugging Face, the local server's key) kept out of plain files where possible.

Keys go to the OS keyring (Secret Service, macOS Keychain, Windows Credential Locker).
When no keyring backend works (a bare Linux session, CI), they fall back to the
settings file and `SecretStore.warning` says so, for the UI to show next to the field.
"""

from __future__ import annotations

import contextlib
import secrets as token_source

from app.studio.settings import Settings

KEYRING_SERVICE = "paddock-studio"

# The names the Studio uses; any other name works too.
OPENROUTER_API_KEY = "openrouter_api_key"
HF_TOKEN = "hf_token"
SERVER_API_KEY = "server_api_key"
REMOTE_ENGINE_API_KEY = "remote_engine_api_key"


def generate_api_key() -> str:
    """A fresh key for the local API: 24 random bytes, URL-safe, with a prefix that says whose it is."""
    return "pk-" + token_source.token_urlsafe(24)


class SecretStore:
    def __init__(self, settings: Settings, use_keyring: bool = True) -> None:
        self._settings = settings
        self._keyring = _working_keyring() if use_keyring else None

    @property
    def in_keyring(self) -> bool:
        return self._keyring is not None

    @property
    def warning(self) -> str | None:
        """A sentence for the UI when keys end up in plain text; None when the keyring is used."""
        if self._keyring is not None:
            return None
        return (
            "No working OS keyring was found, so API keys are stored in plain text in "
            f"{self._settings.path} (readable only by you)."
        )

    def get(self, name: str) -> str | None:
        if self._keyring is not None:
            value = self._keyring.get_password(KEYRING_SERVICE, name)
            if value is not None:
                return value
        return self._settings.plaintext_secret(name)  # also finds keys saved before a keyring existed

    def set(self, name: str, value: str) -> None:
        """Store `value` (stripped; an empty value deletes the key) and save the settings if they changed."""
        value = value.strip()
        if not value:
            self.delete(name)
            return
        if self._keyring is not None:
            self._keyring.set_password(KEYRING_SERVICE, name, value)
            self._drop_plaintext(name)
        else:
            self._settings.set_plaintext_secret(name, value)
            self._settings.save()

    def delete(self, name: str) -> None:
        if self._keyring is not None:
            import keyring.errors

            with contextlib.suppress(keyring.errors.PasswordDeleteError):  # there was none
                self._keyring.delete_password(KEYRING_SERVICE, name)
        self._drop_plaintext(name)

    def _drop_plaintext(self, name: str) -> None:
        if self._settings.plaintext_secret(name) is not None:
            self._settings.set_plaintext_secret(name, None)
            self._settings.save()


def _working_keyring():  # -> keyring.backend.KeyringBackend | None
    """The active keyring backend if it can actually store and read, else None."""
    try:
        import keyring
        from keyring.backends import fail

        backend = keyring.get_keyring()
        if isinstance(backend, fail.Keyring) or getattr(backend, "priority", 0) <= 0:
            return None
        backend.get_password(KEYRING_SERVICE, "__probe__")  # a locked or broken backend raises here
        return backend
    except Exception:  # any backend failure means "no keyring", never a crash at start-up
        return None
