"""Errors as JSON, ``{"error": "one line"}`` with a fitting status, never a traceback: each of our
errors answers with its class's ``http_status`` (see :mod:`gpulayer.errors`)."""

from __future__ import annotations

import logging

import redis.exceptions
from flask import Flask, Response, jsonify
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException

from .. import errors
from ..models import validation_message

log = logging.getLogger("gpulayer.web")


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _answer(status: int, message: str) -> tuple[Response, int]:
    return jsonify(error=message), status


def install(app: Flask) -> None:
    @app.errorhandler(ApiError)
    def api_error(exc: ApiError) -> tuple[Response, int]:
        return _answer(exc.status, str(exc))

    @app.errorhandler(errors.GpulayerError)
    def gpulayer_error(exc: errors.GpulayerError) -> tuple[Response, int]:
        return _answer(exc.http_status, str(exc))

    @app.errorhandler(ValidationError)
    def invalid(exc: ValidationError) -> tuple[Response, int]:
        return _answer(400, f"invalid request: {validation_message(exc)}")

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> tuple[Response, int]:
        return _answer(exc.code or 500, exc.description or exc.name)

    @app.errorhandler(redis.exceptions.ConnectionError)
    def unreachable(exc: redis.exceptions.ConnectionError) -> tuple[Response, int]:
        return _answer(errors.RedisUnavailable.http_status, f"cannot reach Redis: {exc}")

    @app.errorhandler(RecursionError)
    def too_deep(exc: RecursionError) -> tuple[Response, int]:
        # JSON nested thousands deep: Python's parser gives up, as should the request.
        return _answer(400, "the request's JSON nests too deep to read")

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> tuple[Response, int]:
        log.exception("unexpected error")
        return _answer(500, "internal error; the server's log has the details")
