"""Run a trigger the way the triggerer does and take the one event it fires."""

from __future__ import annotations

import asyncio

from airflow.triggers.base import BaseTrigger


def first_event(trigger: BaseTrigger, timeout: float = 60.0) -> dict:
    """The payload of the trigger's first event (bounded wait)."""
    async def take() -> dict:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(take(), timeout=timeout))
