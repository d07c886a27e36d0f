"""The run's secret: made once per process tree, carried as a Bearer token, compared exactly."""

from __future__ import annotations

import pytest

from telescope.core.cluster import run_secret


def test_made_once_and_kept_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(run_secret.ENV_VAR, raising=False)
    first = run_secret.ensure_run_secret()
    assert len(first) == 64 and int(first, 16) >= 0  # 32 random bytes, hex
    assert run_secret.ensure_run_secret() == first == run_secret.current_run_secret()
    assert run_secret.auth_headers() == {"Authorization": f"Bearer {first}"}


def test_a_user_secret_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(run_secret.ENV_VAR, "mine")
    assert run_secret.ensure_run_secret() == "mine"


def test_a_server_without_a_secret_refuses_to_start_open(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(run_secret.ENV_VAR, raising=False)
    with pytest.raises(run_secret.MissingRunSecretError, match="TELESCOPE_RUN_SECRET"):
        run_secret.current_run_secret()
    assert run_secret.auth_headers() == {}


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("Bearer s3cret", True),
        ("bearer s3cret", True),
        ("Bearer s3cret ", True),
        ("Bearer s3cre", False),
        ("Bearer s3cretX", False),
        ("Basic s3cret", False),
        ("s3cret", False),
        ("", False),
        (None, False),
    ],
)
def test_only_the_exact_bearer_token_is_authorized(header: str | None, ok: bool) -> None:
    assert run_secret.authorized(header, "s3cret") is ok


def test_an_empty_secret_authorizes_nothing() -> None:
    assert not run_secret.authorized("Bearer ", "")
