"""Every error embedx raises, each carrying its HTTP status and its OpenAI `type` and `code`."""

from __future__ import annotations

from typing import Any, ClassVar


class EmbedxError(Exception):
    """Base class. The server turns any subclass into the OpenAI error envelope."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    code: ClassVar[str] = "internal_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def envelope(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str]:
        return {}


# The OpenAI SDK retries a 409 and any 5xx, twice by default with backoff, unless the response
# says no retry will help.
NO_RETRY = {"x-should-retry": "false"}


class ConfigError(EmbedxError):
    """A setting has a bad value; raised at start-up, before anything is served."""

    code = "invalid_config"


class Bug(EmbedxError):
    """A broken invariant inside embedx. This is a bug: please report it."""

    code = "internal_bug"

    def __init__(self, message: str) -> None:
        super().__init__(f"{message} This is a bug in embedx.")


class EmbeddingFailed(EmbedxError):
    """Every attempt to embed an input failed, on every device."""

    code = "embedding_failed"


# 400: the request itself is wrong.
class InvalidRequest(EmbedxError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class InvalidJSON(InvalidRequest):
    code = "invalid_json"


class InvalidInput(InvalidRequest):
    code = "invalid_input"


class EmptyInput(InvalidRequest):
    code = "empty_input"


class TooManyItems(InvalidRequest):
    code = "too_many_items"


class TokenInputNotSupported(InvalidRequest):
    code = "unsupported_input"


class InputTooLong(InvalidRequest):
    code = "context_length_exceeded"


class InvalidOption(InvalidRequest):
    code = "invalid_option"


class UnsupportedDimensions(InvalidRequest):
    code = "invalid_dimensions"


class PoolingRequired(InvalidRequest):
    code = "pooling_required"


class WrongModelTask(InvalidRequest):
    """A request that the model it names is not for: texts to embed sent to a model that
    scores pairs, or the other way round. `task` is what the model does."""

    code = "wrong_model_task"

    def __init__(self, message: str, *, task: str, param: str | None = "model") -> None:
        super().__init__(message, param=param)
        self.task = task


class PickleOnlyWeights(InvalidRequest):
    code = "unsafe_weights"


class InvalidModel(InvalidRequest):
    code = "invalid_model"


class NativeCodeLacks(InvalidModel):
    """A feature of the checkpoint that embedx's own model code lacks and transformers has:
    `implementation = "auto"` runs such a model through transformers."""


# 401, 404, 405, 408, 409, 413
class AuthenticationFailed(EmbedxError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": 'Bearer realm="embedx"'}


class NotFound(EmbedxError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class MethodNotAllowed(EmbedxError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"

    def __init__(self, message: str, *, allow: list[str]) -> None:
        super().__init__(message)
        self.allow = allow

    def headers(self) -> dict[str, str]:
        return {"Allow": ", ".join(self.allow)}


class BodyTimeout(EmbedxError):
    """The request body did not arrive in time (EMBEDX_BODY_TIMEOUT_S)."""

    status = 408
    type = "invalid_request_error"
    code = "body_timeout"

    def headers(self) -> dict[str, str]:
        # the rest of the body may still come: the connection cannot carry another request
        return {"Connection": "close"}


class PoolingConflict(EmbedxError):
    status = 409
    type = "invalid_request_error"
    code = "pooling_conflict"

    def headers(self) -> dict[str, str]:
        return {**NO_RETRY}  # the model stays loaded with its pooling until it is evicted


class PayloadTooLarge(EmbedxError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class UnsupportedMediaType(EmbedxError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


# 503: the request is fine, embedx cannot serve it now.
class Unavailable(EmbedxError):
    status = 503
    type = "server_error"
    code = "unavailable"
    retry_after_s: ClassVar[int] = 5

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


class NoDeviceFits(Unavailable):
    code = "no_device_fits"
    retry_after_s = 60


class NoDeviceAvailable(Unavailable):
    code = "no_device_available"
    retry_after_s = 30


class SmokeTestFailed(Unavailable):
    code = "smoke_test_failed"
    retry_after_s = 60


class DeviceHung(NoDeviceAvailable):
    """A batch ran far past its expected time: its device is taken out of service."""

    code = "device_hung"


class ModelsBusy(Unavailable):
    code = "models_busy"

    def __init__(self, message: str, *, param: str | None = None, retry: bool = True) -> None:
        super().__init__(message, param=param)
        self.retry = retry  # False: no retry will help

    def headers(self) -> dict[str, str]:
        return super().headers() if self.retry else {**NO_RETRY}


class UnverifiableWeights(Unavailable):
    code = "weights_unverifiable"
    retry_after_s = 60


class ModelUnavailable(Unavailable):
    code = "model_unavailable"
    retry_after_s = 30


class QueueTimeout(Unavailable):
    code = "queue_timeout"


class ShuttingDown(Unavailable):
    code = "shutting_down"
    retry_after_s = 10
