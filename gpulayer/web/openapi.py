"""The OpenAPI document of /api/v1, served at /api/v1/openapi.json. Its schemas come from the same
pydantic models the routes validate with and answer from; a test checks that it lists exactly the
routes the app serves, and fuzzes them against it (schemathesis)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from .. import __version__
from ..inventory import Telemetry, WorkerInfo
from ..models import ActivitySample, JobRecord, JobState, LogLine, QueueInfo, TokenInfo
from ..provisioned import Machine
from .api import MAX_LIST, SubmitRequest, TokenRequest

openapi = Blueprint("openapi", __name__, url_prefix="/api/v1")
_REF = "#/components/schemas/{model}"
_MODELS: list[type[BaseModel]] = [
    JobRecord,
    LogLine,
    WorkerInfo,
    QueueInfo,
    TokenInfo,
    Telemetry,
    ActivitySample,
    Machine,
    SubmitRequest,
    TokenRequest,
]


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _object(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties)}


_ERROR = _json(_object(error={"type": "string"}), "An error, in one line")
_NULLABLE_INT = {"anyOf": [{"type": "integer"}, {"type": "null"}]}
_NULLABLE_NUMBER = {"anyOf": [{"type": "number"}, {"type": "null"}]}
_NULLABLE_STRING = {"anyOf": [{"type": "string"}, {"type": "null"}]}
_JOB_ID = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[0-9a-f]{12}$"},
}


_MINUTES = {
    "name": "minutes",
    "in": "query",
    "required": False,
    "schema": {"type": "integer", "minimum": 1, "maximum": 60},
}


def _query(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema}


def _operation(
    summary: str, role: str, ok: dict[str, Any], status: str = "200", **extra: Any
) -> dict[str, Any]:
    # 429: the request's address made too many wrong guesses at a token lately (logins and bearer tokens).
    errors = {code: _ERROR for code in ("400", "401", "403", "404", "409", "429", "503")}
    return {
        "summary": summary,
        "description": f"Needs the {role} role (or admin).",
        "security": [{"token": []}],
        "responses": {status: ok, **errors},
        **extra,
    }


def document() -> dict[str, Any]:
    _, schemas = models_json_schema([(model, "serialization") for model in _MODELS], ref_template=_REF)
    records = {"type": "array", "items": _ref(JobRecord)}
    paths = {
        "/api/v1/jobs": {
            "get": _operation(
                "The newest jobs first, a page at a time",
                "viewer",
                _json(_object(jobs=records, next_offset=_NULLABLE_INT)),
                parameters=[
                    _query("state", {"type": "string", "enum": [state.value for state in JobState]}),
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
                    _query("offset", {"type": "integer", "minimum": 0, "maximum": 10**9}),
                ],
            ),
            "post": _operation(
                "Submit a command job, or a list of jobs that differ only in their command",
                "submitter",
                _json(
                    {
                        "oneOf": [
                            _object(id={"type": "string"}),
                            _object(ids={"type": "array", "items": {"type": "string"}}),
                        ]
                    },
                    "Created",
                ),
                status="201",
                requestBody={
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "oneOf": [
                                    _ref(SubmitRequest),
                                    {
                                        "type": "array",
                                        "items": _ref(SubmitRequest),
                                        "minItems": 1,
                                        "maxItems": MAX_LIST,
                                    },
                                ]
                            }
                        },
                        "multipart/form-data": {
                            "schema": {
                                "type": "object",
                                "properties": {
                                    "spec": {
                                        "type": "string",
                                        "description": "The job as JSON (SubmitRequest)",
                                    },
                                    "source": {"type": "string", "format": "binary"},
                                    "inputs": {
                                        "type": "array",
                                        "items": {"type": "string", "format": "binary"},
                                    },
                                },
                                "required": ["spec"],
                            }
                        },
                    },
                },
            ),
        },
        "/api/v1/jobs/{job_id}": {
            "get": _operation(
                "A job's record, with the placement reasons and the autoscaler's decision while it is queued",
                "viewer",
                _json(
                    {
                        "allOf": [
                            _ref(JobRecord),
                            _object(reasons={"type": "array"}, capacity=_NULLABLE_STRING),
                        ]
                    }
                ),
                parameters=[_JOB_ID],
            )
        },
        "/api/v1/jobs/{job_id}/cancel": {
            "post": _operation(
                "Cancel a job",
                "submitter",
                _json(_object(id={"type": "string"}, state={"type": "string"})),
                parameters=[_JOB_ID],
            )
        },
        "/api/v1/jobs/{job_id}/logs": {
            "get": _operation(
                "A page of a job's log lines",
                "viewer",
                _json(
                    _object(lines={"type": "array", "items": _ref(LogLine)}, next_after={"type": "string"})
                ),
                parameters=[
                    _JOB_ID,
                    _query("after", {"type": "string", "pattern": "^[0-9]+-[0-9]+$"}),
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
                    _query("rank", {"type": "integer", "minimum": 0}),
                ],
            )
        },
        "/api/v1/jobs/{job_id}/outputs": {
            "get": _operation(
                "A job's outputs, as a gzip-compressed tar archive",
                "viewer",
                {
                    "description": "The archive",
                    "content": {"application/gzip": {"schema": {"type": "string", "format": "binary"}}},
                },
                parameters=[_JOB_ID],
            )
        },
        "/api/v1/workers": {
            "get": _operation(
                "The connected workers",
                "viewer",
                _json(_object(workers={"type": "array", "items": _ref(WorkerInfo)})),
            )
        },
        "/api/v1/machines": {
            "get": _operation(
                "The machines the autoscaler started, with their age (s) and cost so far",
                "viewer",
                _json(
                    _object(
                        machines={
                            "type": "array",
                            "items": {
                                "allOf": [
                                    _ref(Machine),
                                    _object(age={"type": "number"}, cost=_NULLABLE_NUMBER),
                                ]
                            },
                        }
                    )
                ),
            )
        },
        "/api/v1/telemetry": {
            "get": _operation(
                "Each connected worker's telemetry samples, oldest first",
                "viewer",
                _json(
                    _object(
                        interval={"type": "number"},
                        workers={
                            "type": "object",
                            "additionalProperties": {"type": "array", "items": _ref(Telemetry)},
                        },
                    )
                ),
                parameters=[_MINUTES],
            )
        },
        "/api/v1/activity": {
            "get": _operation(
                "Samples of the installation (jobs by state, queue depths), oldest first",
                "viewer",
                _json(
                    _object(
                        interval={"type": "number"}, samples={"type": "array", "items": _ref(ActivitySample)}
                    )
                ),
                parameters=[_MINUTES],
            )
        },
        "/api/v1/session": {
            "get": _operation(
                "Who the request is, and its session's CSRF token (null for a token sent with the request)",
                "viewer",
                _json(
                    _object(
                        name={"type": "string"},
                        role={"type": "string"},
                        csrf_token=_NULLABLE_STRING,
                    )
                ),
            )
        },
        "/api/v1/queues": {
            "get": _operation(
                "Queue depths",
                "viewer",
                _json(
                    _object(
                        queues={"type": "array", "items": _ref(QueueInfo)}, gangs_waiting={"type": "integer"}
                    )
                ),
            )
        },
        "/api/v1/tokens": {
            "get": _operation(
                "The API tokens that still work",
                "admin",
                _json(_object(tokens={"type": "array", "items": _ref(TokenInfo)})),
            ),
            "post": _operation(
                "Make a token (shown only in this answer)",
                "admin",
                _json({"allOf": [_ref(TokenInfo), _object(token={"type": "string"})]}, "Created"),
                status="201",
                requestBody={
                    "required": True,
                    "content": {"application/json": {"schema": _ref(TokenRequest)}},
                },
            ),
        },
        "/api/v1/tokens/{name}": {
            "delete": _operation(
                "Revoke a token",
                "admin",
                _json(_object(revoked={"type": "string"}, by={"type": "string"})),
                parameters=[{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
            )
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "GPUlayer API", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": schemas["$defs"],
            "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}},
        },
    }


@openapi.get("/openapi.json")
def served() -> Response:
    """Public: the document says what the API is, nothing about what is in it."""
    return jsonify(document())
