"""Hidden-state capture adapters for speculators' worker extension.

* :func:`capture_forward` (F5) - the base-model forward speculators 0.3.0 binds
  onto the model, written against the current vLLM model API: embeddings via
  ``embed_input_ids`` (renamed from ``get_input_embeddings`` in vLLM 0.11.1) and
  extra layer keyword arguments passed through.  Captures, like 0.3.0, the
  OUTPUT of each chosen layer (``hidden + residual``) on TP rank 0.
* :class:`PerRequestStore` (F10, worker side) - rows of every forward are
  split by request id using the worker's own batch layout
  (``input_batch.req_ids`` and the step's ``num_scheduled_tokens``), so engine
  reordering can no longer move rows between sequences.
* :func:`assemble_in_order` (F10, driver side) - rebuilds the per-layer tensors
  in the order the requests were added, checking every row count.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice
from typing import Any

#: key of the per-request payload returned by the worker
BY_REQUEST = "spec_compat.by_request"


class RowCountError(RuntimeError):
    """Captured rows do not match the prompt length of a request (data would be lost)."""


def capture_forward(self: Any, input_ids: Any, positions: Any, intermediate_tensors: Any = None,
                    inputs_embeds: Any = None, **extra_layer_kwargs: Any) -> Any:
    from vllm.distributed import get_pp_group, get_tp_group
    from vllm.sequence import IntermediateTensors

    if get_pp_group().is_first_rank:
        if inputs_embeds is not None:
            hidden_states = inputs_embeds
        else:
            embed = getattr(self, "embed_input_ids", None) or self.get_input_embeddings
            hidden_states = embed(input_ids)
        residual = None
    else:
        assert intermediate_tensors is not None
        hidden_states = intermediate_tensors["hidden_states"]
        residual = intermediate_tensors["residual"]

    extension = self._extension
    capture = get_tp_group().rank_in_group == 0
    wanted = extension._layer_ids if capture else frozenset()
    captured = []
    for offset, layer in enumerate(islice(self.layers, self.start_layer, self.end_layer)):
        hidden_states, residual = layer(positions, hidden_states, residual, **extra_layer_kwargs)
        if self.start_layer + offset in wanted:
            captured.append((hidden_states + residual).clone())

    if not get_pp_group().is_last_rank:
        return IntermediateTensors({"hidden_states": hidden_states, "residual": residual})
    hidden_states, _ = self.norm(hidden_states, residual)
    if capture and captured:
        extension._store_captured_states(captured)
    return hidden_states


class PerRequestStore:
    """Per-request accumulation of captured layer rows inside one worker."""

    def __init__(self) -> None:
        self.chunks: dict[str, list[list[Any]]] = {}
        self.step_tokens: dict[str, int] | None = None

    def begin_step(self, num_scheduled_tokens: dict[str, int]) -> None:
        self.step_tokens = dict(num_scheduled_tokens)

    def end_step(self) -> None:
        self.step_tokens = None

    def store(self, layers: Sequence[Any], req_ids: Sequence[str]) -> None:
        if self.step_tokens is None:
            return  # a warm-up / profiling forward outside any scheduled step: no request owns it
        counts = [self.step_tokens[r] for r in req_ids]
        rows = int(layers[0].shape[0])
        if sum(counts) > rows:
            raise RowCountError(
                f"spec_compat[capture-per-request]: step scheduled {sum(counts)} tokens for "
                f"{len(req_ids)} requests but the forward produced {rows} rows"
            )
        start = 0
        for req_id, n in zip(req_ids, counts):
            self.chunks.setdefault(req_id, []).append([h[start:start + n] for h in layers])
            start += n

    def collect(self) -> dict[str, list[Any]] | None:
        """{request id: [tensor per layer]}; clears the store."""
        if not self.chunks:
            return None
        import torch

        out = {}
        for req_id, parts in self.chunks.items():
            n_layers = len(parts[0])
            out[req_id] = [
                # a one-step request's rows are a view of the whole step: pickling a view sends
                # the whole step (2.3x the captured bytes measured), so it is copied out
                parts[0][i].clone() if len(parts) == 1 else torch.cat([p[i] for p in parts], dim=0)
                for i in range(n_layers)
            ]
        self.chunks = {}
        return out


def find_payload(reply: Any) -> dict[str, list[Any]] | None:
    if isinstance(reply, dict) and BY_REQUEST in reply:
        return reply[BY_REQUEST]
    return None


def check_row_counts(counts: dict[str, int], order: Sequence[tuple[str, int]], patch_id: str) -> None:
    """Raise :class:`RowCountError` naming the requests of ``order`` ((request id, prompt
    length), ...) that have no rows in ``counts`` or another number of rows."""
    missing = [rid for rid, _ in order if rid not in counts]
    wrong = [(rid, n, counts[rid]) for rid, n in order if rid in counts and counts[rid] != n]
    if missing or wrong:
        parts = []
        if missing:
            parts.append(f"no rows for {len(missing)} request(s) ({', '.join(missing[:5])})")
        if wrong:
            parts.append("row count != prompt length for " + ", ".join(
                f"{rid}: {got} != {n}" for rid, n, got in wrong[:5]))
        raise RowCountError(f"spec_compat[{patch_id}]: " + "; ".join(parts))


def assemble_in_order(by_request: dict[str, list[Any]], order: Sequence[tuple[str, int]]) -> list[Any]:
    """Concatenate per-request rows in ``order`` ((request id, prompt length), ...),
    raising :class:`RowCountError` if any request lost or gained rows."""
    import torch

    check_row_counts({rid: int(rows[0].shape[0]) for rid, rows in by_request.items()}, order,
                     "rows-by-request-id")
    n_layers = len(next(iter(by_request.values())))
    return [torch.cat([by_request[rid][i] for rid, _ in order], dim=0) for i in range(n_layers)]
