"""The doctor's checks.  Each takes the :class:`~spec_compat.doctor.Inputs` and returns a
:class:`~spec_compat.doctor.Finding` (``ok`` / ``problem`` with cause, fix and evidence) or raises
:class:`~spec_compat.doctor.Skip` naming what it lacks.  Order: what reads only headers first."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..fixtures.sharegpt import rendered_ids
from .findings import Finding, Skip
from .inputs import Inputs
from .rows import SAME, compare, describe

#: a draft vocabulary covering less than this share of the target's own reply tokens is a problem
COVERAGE = 0.97
#: share of trained (loss-mask) tokens that must lie inside the assistant's replies
MASK_INSIDE = 0.98


def fit(inp: Inputs) -> Finding:
    """The draft fits the target: widths, vocabulary, ``d2t`` range, aux layers (as ``evaluate`` refuses)."""
    from ..shims.draft_heads import d2t_problems, fit_problems, integer_tensor, served_ids, tensor_shapes

    cfg, tcfg = inp.draft_config(), inp.target_text_config()
    shapes = tensor_shapes(inp.draft)
    if not shapes:
        raise Skip(f"no weight file (*.safetensors) in the draft directory {inp.draft}")
    ids, convention, _ = served_ids(cfg)
    n = int(tcfg["num_hidden_layers"])
    problems = fit_problems(cfg, shapes, target_hidden=int(tcfg["hidden_size"]), target_vocab=int(tcfg["vocab_size"]),
                            target_layers=n, ids=ids, convention=convention)
    problems += d2t_problems(integer_tensor(inp.draft, "d2t"), int(tcfg["vocab_size"]))
    ev = {"draft_tensors": len(shapes), "target_hidden": tcfg["hidden_size"], "target_vocab": tcfg["vocab_size"],
          "target_layers": n}
    if problems:
        return Finding.problem("the draft does not fit the target: " + "; ".join(problems),
                               "train the draft against this target (or serve it with the target it was trained for)", ev)
    return Finding.ok("widths, vocabulary, d2t and aux layers fit the target", ev)


def _served_layers(inp: Inputs) -> tuple[tuple[int, ...], str]:
    from ..shims.draft_heads import served_ids, vllm_default_ids

    ids, convention, where = served_ids(inp.draft_config())
    if ids is None:
        return vllm_default_ids(int(inp.target_text_config()["num_hidden_layers"])), \
            "vLLM's default (2, N//2, N-3): the draft's config names no aux layers"
    return tuple(ids), f"the draft's config ({where}, {convention} convention)"


def rows(inp: Inputs) -> Finding:
    """A sample of the rows against a fresh forward of the target: which states they hold, whether each
    row is its own token's, whether the aux layers are the ones vLLM will feed the served draft."""
    data = inp.data_sample()
    if not data.total:
        return Finding.problem(f"the training data in {data.directory} holds no samples: preprocessing dropped every "
                               "conversation (K6 with speculators 0.3/0.4 and a Python tokenizer such as Kimi's: no "
                               "offsets; each conversation's error is logged and skipped)",
                               "patch slow-tokenizer-offsets, then prepare the data again", {"layout": data.layout,
                                                                                             "samples": 0})
    f = compare(inp.target_states, data.samples)
    served, said = _served_layers(inp)
    n_aux = len(served)
    holds = [s.holds for s in f.slots]
    ev: dict[str, Any] = {"samples": f.samples, "rows": f.rows, "slots": [f"{s.holds} (cos {s.cosine})" for s in f.slots],
                          "served_aux_layers": list(served), "served_from": said}
    if data.layer_ids:
        ev["data_config_layer_ids"] = data.layer_ids
    problems, fixes = [], []
    aux = holds[:n_aux]
    want = [f"input:{i}" for i in served]
    if len(holds) >= n_aux and aux != want and all(h.startswith("input:") for h in aux):
        got = [int(h.split(":")[1]) for h in aux]
        off = {g - w for g, w in zip(got, served)}
        if off == {1}:
            problems.append(f"the rows' aux states are the outputs of layers {[g - 1 for g in got]} (the inputs of "
                            f"{got}), but vLLM feeds the served draft the inputs of {list(served)} ({said}): one layer "
                            "off (O6: speculators 0.3/0.4 capture layer outputs)")
            fixes.append(f"name the layers the rows hold in the draft's config.json: \"eagle_aux_hidden_state_layer_ids\": "
                         f"{got} (what the patch draft-names-its-aux-layers writes when the draft is trained)")
        else:
            problems.append(f"the rows hold {[describe(h) for h in aux]}; the served draft is fed the inputs of "
                            f"{list(served)} ({said})")
            fixes.append("extract the rows at the layers the draft is served with, or name them in the draft's config")
    if len(set(aux)) == 1 and n_aux > 1 and aux[0] != "unknown":
        problems.append(f"every aux slot holds the same state ({describe(aux[0])}): only one layer was captured")
        fixes.append("capture one layer per aux id")
    if holds and holds[-1] == "postnorm":
        problems.append("the last slot holds the last layer's output after the final norm; the trainer applies the "
                        "norm itself (the targets are normed twice)")
        fixes.append("save the last layer's output before the final norm")
    unknown = [s.slot for s in f.slots if s.holds == "unknown"]
    # the deepest slot holds the last layer's states of *other* sampled sequences: rows out of place, not K3
    foreign_rows = bool(f.rows) and f.other_sequences >= 0.5 * f.rows
    if unknown and not foreign_rows:
        problems.append(f"slots {unknown} match no state of the target (best cosine {min(s.cosine for s in f.slots):.3f}"
                        f" < {SAME}): the rows were made by another checkpoint, or the capture called the layers "
                        "without an argument their model computes (K3: DeepSeek-V3 / Kimi-K2.5's llama_4_scaling)")
        fixes.append("extract the rows from this target with the layers called as the model calls them (patch "
                     "capture-layer-hooks)")
    if f.rows:
        ev.update(own_rows=round(f.own / f.rows, 4), foreign_rows=round(f.foreign / f.rows, 4),
                  rows_of_other_sampled_sequences=round(f.other_sequences / f.rows, 4),
                  shifted_rows=round(sum(f.shifted.values()) / f.rows, 4),
                  shifts=dict(Counter(dict(f.shifted.most_common(6)))))
    if f.short:
        ev["short_samples"] = [f"sample {i}: {r} rows for {t} tokens" for i, r, t in f.short]
    if f.ids_differ:
        ev["rows_saved_for_other_tokens"] = f.ids_differ
    misplaced = f.rows - f.own
    # rows are placed by the deepest slot: where it holds no state of the target, placement says nothing
    many_misplaced = bool(f.rows) and misplaced / f.rows > 1 - SAME and (foreign_rows or holds[-1] != "unknown")
    if many_misplaced:
        shifts = [d for d, _ in f.shifted.most_common()]
        block_rows = sum(c for d, c in f.shifted.items() if d > 0 and d % 16 == 0)
        blocky = bool(f.shifted) and block_rows >= 0.8 * sum(f.shifted.values())
        cause = (f"{misplaced} of {f.rows} sampled rows are not their token's state: {sum(f.shifted.values())} hold "
                 f"another position of the same sequence (shifts {shifts[:6]}), {f.foreign} no position of it")
        if blocky:
            cause += ("; the shifts are whole 16-token KV blocks: prefix caching served cached blocks (no rows) and "
                      "the generator sliced the shorter capture by the full lengths (F8)")
            fixes.append("capture with prefix caching off (patch prefix-caching-off; vLLM --no-enable-prefix-caching)")
        else:
            cause += ("; rows of other sequences in place of a sample's own: engine order taken for input order (F10) "
                      "or results paired by position (G1)")
            fixes.append("pair rows by request id (patches capture-per-request, rows-by-request-id, "
                         "results-in-input-order)")
        problems.append(cause)
    if f.short and not many_misplaced:
        problems.append(f"{len(f.short)} of {f.samples} samples have fewer rows than tokens (truncated: F9, the tail "
                        "of a chunked prompt aborted)")
        fixes.append("keep unfinished prefills (patch keep-unfinished-prefill)")
    if problems:
        return Finding.problem("; ".join(problems), "; ".join(dict.fromkeys(fixes)), ev)
    return Finding.ok(f"{f.rows} sampled rows are their tokens' states at the served layers ({', '.join(want)}) "
                      "and the last layer before the norm", ev)


def _assistant_header(tok: Any) -> list[int]:
    """The tokens the chat template puts before an assistant reply (its generation prompt)."""
    msgs = [{"role": "user", "content": "x"}]
    with_gen, without = rendered_ids(tok, msgs, True), rendered_ids(tok, msgs, False)
    k = 0
    while k < min(len(with_gen), len(without)) and with_gen[k] == without[k]:
        k += 1
    return with_gen[k:]


def _spans(ids: list[int], header: list[int], end: set[int]) -> set[int]:
    """Positions of assistant reply tokens (after each header, through the end-of-turn token)."""
    inside: set[int] = set()
    h = len(header)
    i = 0
    while i + h <= len(ids):
        if h and ids[i:i + h] == header:
            j = i + h
            while j < len(ids):
                inside.add(j)
                if ids[j] in end:
                    break
                j += 1
            i = j
        i += 1
    return inside


def tokens(inp: Inputs) -> Finding:
    """The rows' token ids against the target's chat template: one BOS, the template's opening, and the
    loss mask on the assistant's replies."""
    data = inp.data_sample()
    if not data.samples:
        raise Skip(f"the data in {data.directory} holds no samples")
    tok = inp.tokenizer()
    bos = tok.bos_token_id
    opening = rendered_ids(tok, [{"role": "user", "content": "x"}], False)
    x_ids = set(tok("x", add_special_tokens=False)["input_ids"])
    pre = []
    for t in opening:
        if t in x_ids:
            break
        pre.append(t)
    header = _assistant_header(tok)
    end = {t for t in (tok.eos_token_id, tok.get_vocab().get("<|im_end|>"), tok.get_vocab().get("<|eot_id|>"))
           if isinstance(t, int)}
    two_bos = [s.index for s in data.samples if bos is not None and s.input_ids[:2] == [bos, bos]]
    other_open = [s.index for s in data.samples if s.input_ids[:len(pre) - 2] != pre[:len(pre) - 2]
                  and s.index not in two_bos]
    trained = inside = reply = untrained_samples = 0
    for s in data.samples:
        spans = _spans(s.input_ids, header, end)
        m = [i for i, v in enumerate(s.loss_mask) if v]
        trained += len(m)
        inside += sum(1 for i in m if i in spans)
        reply += len(spans)
        untrained_samples += not m
    ev = {"samples": len(data.samples), "template_opening": tok.decode(pre[:12]), "assistant_header": tok.decode(header),
          "trained_tokens": trained, "reply_tokens": reply,
          "inside_replies": round(inside / trained, 4) if trained else None,
          "replies_trained": round(inside / reply, 4) if reply else None, "samples_with_nothing_trained": untrained_samples}
    problems, fixes = [], []
    if two_bos:
        problems.append(f"{len(two_bos)} of {len(data.samples)} samples open with two BOS tokens ({tok.decode([bos])} "
                        "twice): the rendered chat template already opens with it and the tokenizer added one; "
                        "served prompts have one")
        fixes.append("tokenize rendered chat text without adding special tokens (add_special_tokens=False), or use "
                     "a tokenizer that adds no BOS (spec-compat fixture smollm2 writes one)")
    if other_open:
        problems.append(f"{len(other_open)} samples do not open as the target's chat template does "
                        f"({tok.decode(pre[:8])!r}...): another template or system prompt than serving uses")
        fixes.append("render the training conversations with the target's own chat template")
    if (trained and inside / trained < MASK_INSIDE) or (reply and inside / reply < MASK_INSIDE):
        problems.append(f"the loss masks miss the assistant's replies: {trained - inside} of {trained} trained tokens "
                        f"lie outside them and {reply - inside} of {reply} reply tokens are not trained "
                        f"({untrained_samples} samples train nothing): the masks belong to other samples (G1: "
                        "speculators 0.4.0.1's results in text-sorted request-id order, masks paired by position) "
                        "or were built for another template")
        fixes.append("pair each result with its own input (patch results-in-input-order), or rebuild the masks")
    if problems:
        return Finding.problem("; ".join(problems), "; ".join(fixes), ev)
    return Finding.ok("one BOS, the template's opening, loss masks on the replies", ev)


def vocabulary(inp: Inputs) -> Finding:
    """The share of the target's own reply tokens (the training replies, regenerated by the target) that
    the draft's vocabulary holds, against what a vocabulary of the same size built from them holds."""
    from ..shims.draft_heads import integer_tensor, tensor_shapes

    if not tensor_shapes(inp.draft):
        raise Skip(f"no weight file (*.safetensors) in the draft directory {inp.draft}")
    d2t = integer_tensor(inp.draft, "d2t")
    if not d2t:
        raise Skip("the draft has no d2t: its vocabulary is the target's whole")
    vocab = {i + off for i, off in enumerate(d2t)}
    data = inp.data_sample()
    replies = [t for s in data.samples for t, m in zip(s.input_ids, s.loss_mask) if m]
    if not replies:
        raise Skip("the sampled data has no trained tokens")
    covered = sum(1 for t in replies if t in vocab) / len(replies)
    ev: dict[str, Any] = {"draft_vocab": len(d2t), "reply_tokens": len(replies), "covered": round(covered, 4)}
    if data.token_freq:
        top = {t for t, _ in sorted(data.token_freq.items(), key=lambda kv: -kv[1])[:len(d2t)]}
        ev["covered_by_the_data_token_freq"] = round(sum(1 for t in replies if t in top) / len(replies), 4)
        ev["data_token_freq_top_in_draft_vocab"] = round(len(vocab & top) / len(top), 4) if top else None
    if covered < COVERAGE:
        return Finding.problem(
            f"the draft's {len(d2t)}-token vocabulary holds {covered:.1%} of the target's reply tokens in the sampled "
            "data: it was built from other data (every token outside it is a rejected draft)",
            "build the vocabulary mapping (d2t/t2d, token_freq.pt) from the training replies", ev)
    return Finding.ok(f"the draft's vocabulary holds {covered:.1%} of the reply tokens", ev)


#: positions where the target's next token with and without its final norm differ, below which the
#: targets check cannot tell which the draft learned
TARGETS_MIN_DIFFER = 10


def targets(inp: Inputs) -> Finding:
    """What the draft learned to predict: its first guesses on the sampled replies, fed the target's
    states at the served aux layers (as vLLM feeds it), against the target's next token after its final
    norm (what it emits) and without it (O7: speculators < 0.4 trained on the latter)."""
    import torch

    from .draft_forward import first_guesses, load_draft
    from .rows import MAX_TOKENS

    data = inp.data_sample()
    served, said = _served_layers(inp)
    model = inp.target_model()
    embed = model.get_input_embeddings().weight.detach().float()
    head = model.get_output_embeddings().weight.detach().float()
    w = load_draft(inp.draft)
    if not w:
        raise Skip(f"no weight file (*.safetensors) in the draft directory {inp.draft}")
    total = right = differ = follows_normed = follows_raw = 0
    for s in data.samples:
        ids = list(s.input_ids)[:MAX_TOKENS]
        trained = torch.tensor(list(s.loss_mask)[:MAX_TOKENS][2:], dtype=torch.bool)
        if len(ids) < 3 or not bool(trained.any()):
            continue
        st = inp.target_states(ids)
        if "postnorm" not in st:
            raise Skip("the target has no final norm to compare against")
        try:
            guess = first_guesses(w, inp.draft_config(), torch.cat([st[f"input:{i}"] for i in served], -1),
                                  torch.tensor(ids), embed)[:-1][trained]
        except KeyError as exc:
            raise Skip(f"the draft's weights are not in the speculators layout (no tensor {exc})") from None
        normed = (st["postnorm"] @ head.T).argmax(-1)[1:-1][trained]  # the target's greedy next token
        raw = (st["prenorm"] @ head.T).argmax(-1)[1:-1][trained]
        d = normed != raw
        total += int(trained.sum())
        right += int((guess == normed).sum())
        differ += int(d.sum())
        follows_normed += int((guess[d] == normed[d]).sum())
        follows_raw += int((guess[d] == raw[d]).sum())
    if not total:
        raise Skip("the sampled data has no trained tokens")
    ev: dict[str, Any] = {"positions": total, "first_guess_agrees_with_target": round(right / total, 4),
                          "positions_where_the_norm_changes_the_token": differ,
                          "draft_follows_after_norm": follows_normed, "draft_follows_without_norm": follows_raw,
                          "served_aux_layers": list(served), "served_from": said}
    if differ >= TARGETS_MIN_DIFFER and follows_raw > follows_normed:
        return Finding.problem(
            f"where the target's next token with and without its final norm differ ({differ} of {total} positions), "
            f"the draft guesses the one without the norm {follows_raw} times and the target's own {follows_normed} "
            "times: it was trained on logits of the last layer before the final norm (O7: speculators < 0.4's "
            "trainer), which the target never emits",
            "retrain with the targets after the final norm (patch targets-after-final-norm; speculators >= 0.4)", ev)
    if differ < TARGETS_MIN_DIFFER:
        return Finding.ok(f"first guesses agree with the target's {right / total:.1%}; the final norm changes the next token at only "
                          f"{differ} positions, too few to tell which targets the draft learned", ev)
    return Finding.ok(f"the draft learned the target's output after its final norm ({follows_normed} of {differ} "
                      f"positions where the norm changes the token); its first guesses agree with the target's greedy "
                      f"next token at {right / total:.1%} of the sampled reply positions", ev)


def measured(inp: Inputs) -> Finding:
    """The draft served by vLLM on the prompts (``spec-compat evaluate``'s run): lossless, and its
    acceptance per position against a clean draft's of the same size (``--baseline``)."""
    if inp.prompts is None:
        raise Skip("no --prompts given: this check serves the draft in vLLM")
    from ..cli.evaluate import EvaluateError, evaluate

    try:
        res = evaluate(inp.target, inp.draft, inp.prompts, k=inp.k, max_tokens=inp.max_tokens)
    except EvaluateError as exc:
        raise Skip(f"the draft cannot be served here: {exc}") from None
    ev = {"k": res.k, "prompts": res.prompts, "mean_acceptance_length": round(res.mean_acceptance_length, 3),
          "acceptance_rate": round(res.acceptance_rate, 3), "per_position": [round(x, 3) for x in res.per_position],
          "lossless": res.lossless, "baseline": inp.baseline}
    if not res.lossless:
        return Finding.problem(f"speculative decoding with this draft changed the greedy output (first mismatch "
                               f"{res.first_mismatch}): a serving defect, not the draft's quality",
                               "report it with `spec-compat report --json`", ev)
    if inp.baseline and res.mean_acceptance_length < 1 + 0.8 * (inp.baseline - 1):
        return Finding.problem(f"mean acceptance length {res.mean_acceptance_length:.3f} against {inp.baseline:.3f} "
                               f"for a clean draft of the same size (acceptance rate {res.acceptance_rate:.1%}; per "
                               f"position {', '.join(f'{x:.2f}' for x in res.per_position)})",
                               "the other checks' problems name the cause; with none, compare the training "
                               "settings and data size with the clean draft's", ev)
    return Finding.ok(f"lossless; mean acceptance length {res.mean_acceptance_length:.3f}, rate "
                      f"{res.acceptance_rate:.1%}" + (f" (clean draft: {inp.baseline:.3f})" if inp.baseline else ""), ev)


#: the checks in the order they run and print
CHECKS = {"fit": fit, "rows": rows, "tokens": tokens, "vocabulary": vocabulary, "targets": targets,
          "measured": measured}
