"""What ``cdiflow status`` says of retention: the stack's API answers ``GET /api/retention``."""

from __future__ import annotations

from typing import Any, Final

import httpx

__all__ = ["read_retention", "retention_text"]

_TIMEOUT_S: Final = 5.0


def read_retention(api_url: str, api_key: str) -> dict[str, Any]:
    """The API's retention (``{"error": why}`` when it does not answer)."""
    try:
        reply = httpx.get(
            f"{api_url}/api/retention",
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=_TIMEOUT_S,
        )
        reply.raise_for_status()
    except httpx.HTTPError as exc:
        return {"error": f"the API did not say ({exc})"}
    answer: dict[str, Any] = reply.json()
    return answer


def _days(days: int) -> str:
    return "for ever" if days == 0 else f"{days} day{'s' if days != 1 else ''}"


def retention_text(shown: dict[str, Any]) -> str:
    if "error" in shown:
        return f"\nretention: {shown['error']}"
    archive = shown["archive_uri"] or "not archived"
    lines = [
        f"\nretention: finished runs kept {_days(shown['default_days'])}, results "
        f"{shown['default_results']} (the default); pruned runs: {archive}",
    ]
    for own in shown["definitions"]:
        lines.append(
            f"  {own['name']}: {_days(own['effective_days'])}, results {own['effective_results']}"
        )
    last = shown["last_pass"]
    if last is None:
        lines.append("  no pass yet")
    else:
        failed = f"; stopped: {last['error']}" if last["error"] else ""
        lines.append(
            f"  last pass {last['at']}: {last['pruned']:,} pruned in {last['seconds']:.1f} s"
            f"{failed}"
        )
    lines.append(
        f"  {shown['runs_on_record']:,} runs on record; {shown['pruned_total']:,} pruned so far "
        f"({shown['archived_total']:,} archived)"
    )
    return "\n".join(lines)
