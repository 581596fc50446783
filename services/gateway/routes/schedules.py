"""``/api/schedules`` and ``/api/alarms``: an owner's scheduled and self-waking turns."""

from __future__ import annotations

from fastapi import APIRouter, Response

from signalbox.services.gateway import schedules
from signalbox.services.gateway.deps import CurrentUser, GatewayDep, IdPath
from signalbox.shared.schedules_api import (
    AlarmOut,
    ScheduleIn,
    ScheduleOut,
    SchedulePatch,
    ScheduleRunOut,
)

router = APIRouter()


@router.get("/api/schedules", response_model=list[ScheduleOut])
async def list_schedules(user: CurrentUser, gateway: GatewayDep) -> list[ScheduleOut]:
    """My schedules, newest first."""
    return await schedules.list_schedules(gateway, user.id)


@router.post("/api/schedules", response_model=ScheduleOut, status_code=201)
async def create_schedule(user: CurrentUser, gateway: GatewayDep, body: ScheduleIn) -> ScheduleOut:
    """Create a schedule (``interval`` | ``at`` | ``cron``); bad cron or time zone: 422."""
    return await schedules.create_schedule(gateway, user.id, body)


@router.patch("/api/schedules/{schedule_id}", response_model=ScheduleOut)
async def update_schedule(
    schedule_id: IdPath, user: CurrentUser, gateway: GatewayDep, body: SchedulePatch
) -> ScheduleOut:
    """Pause (``{"paused": true}``), resume, or change the prompt."""
    return await schedules.update_schedule(gateway, user.id, schedule_id, body)


@router.delete("/api/schedules/{schedule_id}", status_code=204, response_class=Response)
async def delete_schedule(schedule_id: IdPath, user: CurrentUser, gateway: GatewayDep) -> Response:
    """Delete a schedule and its runs."""
    await schedules.delete_schedule(gateway, user.id, schedule_id)
    return Response(status_code=204)


@router.get("/api/schedules/{schedule_id}/runs", response_model=list[ScheduleRunOut])
async def schedule_runs(
    schedule_id: IdPath, user: CurrentUser, gateway: GatewayDep
) -> list[ScheduleRunOut]:
    """The schedule's last runs, newest first."""
    return await schedules.schedule_runs(gateway, user.id, schedule_id)


@router.get("/api/alarms", response_model=list[AlarmOut])
async def list_alarms(user: CurrentUser, gateway: GatewayDep) -> list[AlarmOut]:
    """My agents' alarms, soonest first."""
    return await schedules.list_alarms(gateway, user.id)


@router.delete("/api/alarms/{alarm_id}", response_model=AlarmOut)
async def cancel_alarm(alarm_id: IdPath, user: CurrentUser, gateway: GatewayDep) -> AlarmOut:
    """Cancel a pending alarm."""
    return await schedules.cancel_alarm(gateway, user.id, alarm_id)
