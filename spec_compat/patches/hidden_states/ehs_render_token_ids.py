"""``/v1/chat/completions/render`` answers ``{"token_ids": [...]}`` on an extraction server
(vLLM 0.15/0.16 backport; on 0.15 a conversation over max-model-len is refused, not cut).

speculators >= 0.8 ``prepare-data --render-endpoint`` tokenizes chat rows through this route
(``data_generation/render_client.py``) and reads the key ``token_ids`` of one object, truncated
with ``truncation_side="right"`` (keep the head); vLLM 0.15/0.16 answer the list
``[conversation, engine_prompts]`` and cut on the tokenizer's side, so every conversation fails
with "Render endpoint response missing 'token_ids'" and is skipped.  On a server started with
``extract_hidden_states`` the route answers as vLLM >= 0.18 does; on any other server the
original route answers.

The answer's helpers (:func:`requested_truncation`, :func:`rendered_token_ids`,
:class:`Truncation`) read the request's truncation, pick the token ids out of vLLM 0.15/0.16's
answer and cut them; pure Python, nothing of vLLM.
"""

from __future__ import annotations

import inspect
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims.hidden_states.contract import SETTINGS_KEY
from .. import _guards as guard
from . import VLLM_WITHOUT_EHS

log = logging.getLogger("spec_compat")

PATH = "/v1/chat/completions/render"
PROOF = "tests/server/test_render_endpoint.py::test_without_the_patch_every_chat_row_is_skipped"


SIDES = ("left", "right")
ID = "ehs-render-token-ids"


class RenderRequestError(ValueError):
    """The request asks for something the render cannot do (answered with HTTP 400)."""


@dataclass(frozen=True)
class Truncation:
    """``truncate_prompt_tokens`` (None: keep all; -1: the model's input limit) and the side."""

    tokens: int | None
    side: str | None

    def apply(self, ids: list[int], default_side: str, limit: int | None) -> list[int]:
        """``ids`` cut to ``tokens`` on ``side`` (the tokenizer's ``default_side`` when the
        request names none, as vLLM >= 0.18 does); ``-1`` means ``limit``."""
        n = limit if self.tokens == -1 else self.tokens
        if n is None or n >= len(ids):
            return ids
        side = self.side or default_side
        if n == 0:
            return []
        return ids[-n:] if side == "left" else ids[:n]


def requested_truncation(tokens: Any, extra: Mapping[str, Any] | None) -> Truncation:
    """The truncation of a render request: ``truncate_prompt_tokens`` (a field of vLLM's
    request) and ``truncation_side`` (an extra field on vLLM 0.15/0.16)."""
    side = (extra or {}).get("truncation_side")
    if side is not None and side not in SIDES:
        raise RenderRequestError(f"spec_compat[ehs-render-token-ids]: truncation_side must be 'left' or 'right', got {side!r}")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < -1):
        raise RenderRequestError(f"spec_compat[ehs-render-token-ids]: truncate_prompt_tokens must be an integer >= -1, "
                                 f"got {tokens!r}")
    return Truncation(tokens, side)


def rendered_token_ids(result: Any) -> list[int]:
    """The prompt token ids of vLLM 0.15/0.16's render result ``(conversation, engine_prompts)``
    (one engine prompt for a chat request); ValueError naming what differs."""
    if not isinstance(result, Sequence) or len(result) != 2:
        raise ValueError(f"spec_compat[ehs-render-token-ids]: the render returned {type(result).__name__}, "
                         "not (conversation, engine_prompts)")
    prompts = result[1]
    if not isinstance(prompts, Sequence) or len(prompts) != 1:
        n = len(prompts) if isinstance(prompts, Sequence) else type(prompts).__name__
        raise ValueError(f"spec_compat[ehs-render-token-ids]: a chat render gave {n} engine prompts, not one")
    prompt = prompts[0]
    if not isinstance(prompt, Mapping) or "prompt_token_ids" not in prompt:
        has = sorted(prompt) if isinstance(prompt, Mapping) else type(prompt).__name__
        raise ValueError(f"spec_compat[ehs-render-token-ids]: the engine prompt has no prompt_token_ids (has {has})")
    ids = prompt["prompt_token_ids"]
    if not isinstance(ids, Sequence) or isinstance(ids, (str, bytes)):
        raise ValueError(f"spec_compat[ehs-render-token-ids]: the engine prompt's prompt_token_ids is {type(ids).__name__}, "
                         "not a list of ids")
    return [int(t) for t in ids]



def _extracting(app_state: Any) -> bool:
    """Whether this API server fronts an ``extract_hidden_states`` engine (ehs-config's settings)."""
    config = getattr(app_state, "vllm_config", None)
    kv = getattr(config, "kv_transfer_config", None)
    extra = getattr(kv, "kv_connector_extra_config", None)
    return isinstance(extra, dict) and SETTINGS_KEY in extra


_WHOLE: dict[type, type] = {}


def _rendered_whole(request: Any) -> Any:
    """A copy of ``request`` whose tokenization has no length limit and no cut (vLLM 0.16 would
    cut on the tokenizer's side, ``left`` by vLLM's default, or refuse a conversation over
    max-model-len before the requested cut applies)."""
    cls = type(request)
    if not hasattr(cls, "build_tok_params"):
        # vLLM 0.15: no tokenization parameters to widen; the length check stays (a conversation over
        # max-model-len answers 400, as to speculators 0.8.1 which asks for no cut) and the cut follows
        return request.model_copy(update={"truncate_prompt_tokens": None})
    sub = _WHOLE.get(cls)
    if sub is None:
        import dataclasses

        def build_tok_params(self: Any, model_config: Any) -> Any:
            params = cls.build_tok_params(self, model_config)
            return dataclasses.replace(params, max_total_tokens=None, truncate_prompt_tokens=None)

        sub = _WHOLE[cls] = type(f"{cls.__name__}RenderedWhole", (cls,), {"build_tok_params": build_tok_params})
    copy = request.model_copy()
    copy.__class__ = sub
    return copy


def _token_ids_route(original: Any) -> Any:
    """The endpoint that answers ``token_ids`` on an extraction server and calls ``original``
    (vLLM's own endpoint) on any other."""

    async def render_token_ids(request: Any, raw_request: Any) -> Any:
        state = raw_request.app.state
        handler = getattr(state, "openai_serving_chat", None)
        if handler is None or not _extracting(state):
            return await original(request, raw_request)
        from fastapi.responses import JSONResponse

        try:
            cut = requested_truncation(request.truncate_prompt_tokens, request.model_extra)
            limit = state.vllm_config.model_config.max_model_len
            if cut.tokens is not None and cut.tokens > limit:
                raise RenderRequestError(f"spec_compat[ehs-render-token-ids]: truncate_prompt_tokens={cut.tokens} cannot be greater "
                                         f"than max_model_len={limit}")
            # with a cut: rendered whole, then cut on the requested side; without: vLLM's own checks
            result = await handler.render_chat_request(_rendered_whole(request) if cut.tokens is not None else request)
            if not isinstance(result, (list, tuple)):  # an ErrorResponse
                return JSONResponse(content=result.model_dump(), status_code=result.error.code)
            tokenizer_side = getattr(handler.renderer.tokenizer, "truncation_side", "left")
            ids = cut.apply(rendered_token_ids(result), tokenizer_side, limit)
        except RenderRequestError as exc:
            return JSONResponse(content=handler.create_error_response(str(exc)).model_dump(), status_code=400)
        except Exception as exc:  # as vLLM's route: the handler names the status
            err = handler.create_error_response(exc)
            return JSONResponse(content=err.model_dump(), status_code=err.error.code)
        return JSONResponse(content={"request_id": f"render-{uuid.uuid4().hex}", "token_ids": ids})

    # FastAPI reads the body model and the Request from the signature: vLLM's endpoint's own
    render_token_ids.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    render_token_ids.__name__ = original.__name__
    return render_token_ids


def _router_with_token_ids(router: Any) -> Any:
    """A copy of vLLM's chat router whose render route is :func:`_token_ids_route` (the module's
    own router is left as it is: other apps and an uninstall see it unchanged)."""
    from fastapi import APIRouter
    from fastapi.routing import APIRoute

    copy = APIRouter()
    found = False
    for route in router.routes:
        if isinstance(route, APIRoute) and route.path == PATH and "POST" in route.methods:
            route = APIRoute(PATH, _token_ids_route(route.endpoint), methods=["POST"],
                             dependencies=route.dependencies, responses=route.responses, name=route.name,
                             response_model=None)
            found = True
        copy.routes.append(route)
    if not found:
        raise TargetChanged(f"the chat router has no POST {PATH} route")
    return copy


def _attach_router(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """vLLM's ``attach_router(app)`` is ``app.include_router(router)`` (checked): here the copy."""
    import sys

    app = args[0] if args else kwargs["app"]
    module = sys.modules[wrapped.__module__]
    app.include_router(_router_with_token_ids(module.router))
    log.debug("spec_compat[%s]: %s answers token_ids on extraction servers", ID, PATH)


@register
class RenderTokenIds(Patch):
    """speculators >= 0.8 ``prepare-data --render-endpoint`` on chat rows against vLLM 0.15/0.16:
    ``chat_completion/api_router.py`` ``render_chat_completion`` answers ``[conversation, engine_prompts]``
    and cuts on the tokenizer's side (vLLM's default ``left``), so every conversation is skipped with "Render
    endpoint response missing 'token_ids'"; now ``{"token_ids": [...]}`` (vLLM >= 0.18's answer) cut on
    ``truncation_side``, on extraction servers."""

    id = ID
    proof = Proof("wrong-values", PROOF, r"Render endpoint response missing 'token_ids'")
    summary = (f"POST {PATH} on an extract_hidden_states server answers {{\"token_ids\": [...]}} as vLLM >= 0.18, "
               "truncate_prompt_tokens cut on truncation_side (right keeps the head)")
    upstream = ("vLLM 0.15/0.16 chat_completion/api_router.py render_chat_completion returns [conversation, "
                "engine_prompts]; speculators >= 0.8 render_client.py reads token_ids")
    target = "vllm.entrypoints.openai.chat_completion.api_router:attach_router"
    requires = {"vllm": VLLM_WITHOUT_EHS}
    side = "server"

    def check(self, module: ModuleType) -> None:
        attach = guard.attr(module, "attach_router")
        guard.exact_params(attach, "api_router.attach_router", "app")
        body = [line.strip() for line in guard.source(attach, "api_router.attach_router").splitlines()[1:]]
        if [line for line in body if line] != ["app.include_router(router)"]:
            raise TargetChanged("api_router.attach_router does more than app.include_router(router)")
        _router_with_token_ids(guard.attr(module, "router"))
        guard.exact_params(guard.attr(module, "render_chat_completion"), "api_router.render_chat_completion",
                           "request", "raw_request")
        chat = guard.attr(module, "OpenAIServingChat")
        guard.exact_params(chat.render_chat_request, "OpenAIServingChat.render_chat_request", "self", "request")
        protocol = guard.attr(module, "ChatCompletionRequest")
        if "truncate_prompt_tokens" not in getattr(protocol, "model_fields", {}):
            raise TargetChanged("ChatCompletionRequest has no field truncate_prompt_tokens")
        if not hasattr(protocol, "build_tok_params"):  # vLLM 0.15: truncation in the serving class
            return
        guard.exact_params(protocol.build_tok_params, "ChatCompletionRequest.build_tok_params", "self",
                           "model_config")
        try:
            from vllm.renderers.params import TokenizeParams
        except ImportError as exc:
            raise TargetChanged(f"vllm.renderers.params.TokenizeParams: {exc}") from None
        fields = getattr(TokenizeParams, "__dataclass_fields__", {})
        if "max_total_tokens" not in fields or "truncate_prompt_tokens" not in fields:
            raise TargetChanged("TokenizeParams has no dataclass fields max_total_tokens / truncate_prompt_tokens")

    def install(self, module: ModuleType, changes: Changes) -> None:
        changes.wrap(module, "attach_router", _attach_router)
