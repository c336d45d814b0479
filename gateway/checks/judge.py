"""unsupported (judge): claims the lexical tier left undecided go to a judge model (DESIGN §10).

`JudgePass.run` takes the pending claims of one answer (claim text, cited chunks, the question)
and returns one CheckResult per claim: pass, fail("unsupported") or error(kind). Calls are
grouped per `group_by` — `chunk`: one call per cited chunk with the claims citing it; `claim`:
one per claim with all its chunks; `answer`: one call — and every verdict is mapped back by the
id the gateway gave it. A claim passes when one of its cited chunks says YES (with `claim` /
`answer`, when its own verdict is YES); PARTIAL counts as YES only with `on_partial: pass`. A
call that fails, times out or answers out of shape is an infrastructure error for its claims.
A verdict is cached under a key covering all its call showed the judge (`JudgePass.plan`).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.checks.support import content_words
from gateway.judge.cache import CacheKeys, VerdictCache
from gateway.judge.client import (
    CallRecord,
    JudgeClient,
    JudgeError,
    UpstreamFactory,
    client_for,
    client_settings,
)
from gateway.judge.prompts import CallItem, ChatBody, Prompt, PromptFormatError, build_prompt
from gateway.types import CheckResult, frozen_init

__all__ = ["PENDING", "JudgePass", "JudgeStats", "Pending"]

PENDING = "judge_pending"  # the lexical tier's error kind for a claim the judge must settle
CHECK = "unsupported"
_PASSED = CheckResult.ok(CHECK)  # a value: one for every claim a judge passes
# The unit of a whole-claim verdict (`group_by: claim` / `answer` with a chat judge), as the
# audit event names it; a pass's units are all chunk ids or all this, never both.
WHOLE = "*"
# A claim this short is shown with its question, to be read (never to be supported) by it:
# "Fik-Shun." says nothing without "who won season 10?".
SHORT_CLAIM_WORDS = 4


@frozen_init
@dataclass(frozen=True, slots=True)
class Pending:
    """One claim for the judge: its index, marker-free text and cited chunks (id, text)."""

    index: int
    claim: str
    chunks: tuple[tuple[str, str], ...]


@dataclass(slots=True)
class JudgeStats:
    """What the pass did for one answer: for metrics and the audit event."""

    prompt_version: str
    model: str
    calls: list[CallRecord] = field(default_factory=list)
    verdicts: dict[str, int] = field(default_factory=dict)  # per (claim, chunk) or claim label
    cache_hits: int = 0
    cache_misses: int = 0
    seconds: float = 0.0
    circuit_open: bool = False
    claims: list[dict[str, Any]] = field(default_factory=list)  # per-claim audit entries
    rationales: dict[int, list[str]] = field(default_factory=dict)

    def merge(self, other: JudgeStats) -> JudgeStats:
        """Both passes' work as one (a progressive stream judges claim by claim)."""
        verdicts = dict(self.verdicts)
        for k, v in other.verdicts.items():
            verdicts[k] = verdicts.get(k, 0) + v
        return JudgeStats(
            self.prompt_version,
            self.model,
            [*self.calls, *other.calls],
            verdicts,
            self.cache_hits + other.cache_hits,
            self.cache_misses + other.cache_misses,
            self.seconds + other.seconds,
            other.circuit_open,
            [*self.claims, *other.claims],
            {**self.rationales, **other.rationales},
        )

    def usage(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.calls:
            for k, v in c.usage.items():
                out[k] = out.get(k, 0) + v
        return out

    def audit(self, include_text: bool) -> dict[str, Any]:
        """The audit event's `judge` field; rationales only with `audit.include_text`."""
        claims = []
        for entry in self.claims:
            e = dict(entry)
            if include_text and entry["index"] in self.rationales:
                e["rationale"] = self.rationales[entry["index"]]
            claims.append(e)
        outcomes: dict[str, int] = {}
        for c in self.calls:
            outcomes[c.outcome] = outcomes.get(c.outcome, 0) + 1
        return {
            "prompt_version": self.prompt_version,
            "model": self.model,
            "calls": outcomes,
            "cache": {"hit": self.cache_hits, "miss": self.cache_misses},
            "ms": round(self.seconds * 1000, 3),
            "claims": claims,
        }


@dataclass(slots=True)
class _Call:
    """One planned call: the chunks shown and the (claim, pair key) items asked."""

    chunks: dict[str, str]
    items: list[CallItem]
    # id the judge sees -> (claim index, chunk id or WHOLE for a whole-claim verdict, cache key)
    targets: dict[str, tuple[int, str, bytes]]


# A call's outcome: its verdicts by the id the judge saw, or its failure.
_Outcome = Mapping[str, tuple[str, str]] | Exception


class JudgePass:
    """The judge pass of one policy: a prompt, a backend and a shared client."""

    def __init__(
        self, spec: Any, client: JudgeClient | None = None, connect: UpstreamFactory | None = None
    ) -> None:
        self.spec = spec
        self.backend: str = spec.backend
        self.group_by: str = spec.group_by
        self.model: str = spec.model
        self.prompt: Prompt = build_prompt(spec.prompt, spec.template)
        self.body = ChatBody(self.prompt, self.model)
        self.prompt_version = (
            f"tei-{spec.label}-{spec.threshold}" if self.backend == "tei" else self.prompt.version
        )
        self._client = client
        self._connect = connect
        self._settings = client_settings(spec, connect)
        self.yes = frozenset({"YES", "PARTIAL"} if spec.on_partial == "pass" else {"YES"})
        self.keys = CacheKeys(self.model, self.prompt_version)  # `fresh()` per answer
        # Verdicts per (claim, chunk) (tei, or `group_by: chunk`), else per claim.
        self.pair_level = self.backend == "tei" or self.group_by == "chunk"
        # What a call gathers: MiniCheck judges one claim against one document per call
        # (None: a call per unit); otherwise `group_by`.
        self._group = None if self.prompt.per_pair and self.backend != "tei" else self.group_by

    @property
    def client(self) -> JudgeClient:
        """The shared client of this endpoint on the running loop."""
        return self._client or client_for(self.spec, self._connect, self._settings)

    # -- planning ----------------------------------------------------------------------------

    def _question_for(self, claim: str, question: str | None) -> str | None:
        if question is None or self.backend == "tei":
            return None
        return question if len(content_words(claim)) <= SHORT_CLAIM_WORDS else None

    def plan(
        self,
        pending: Sequence[Pending],
        question: str | None,
        stats: JudgeStats,
        client: JudgeClient | None = None,
    ) -> tuple[list[_Call], dict[int, dict[str, str]]]:
        """The calls to make, and the verdicts the cache already has
        ({claim index: {chunk id | WHOLE: label}}).

        A verdict is cached under a key that covers everything its call showed the judge: an
        LLM judge may follow the words of any text in its prompt, so a verdict from a call that
        held other claims (or a question) is reused only for that same call, never for its
        claim alone or in other company. A unit's own key (claim, its chunks, the question it
        was shown) is looked up first: it holds only verdicts of calls that asked that unit
        alone. The units it misses are grouped per `group_by` (DESIGN §10); within one call the
        words of one claim, or of the question shown with a short one, may still sway another's
        verdict (a documented residual that `group_by: claim` removes), but never beyond it."""
        cache = (client or self.client).cache
        known: dict[int, dict[str, str]] = {p.index: {} for p in pending}
        calls: list[_Call] = []
        groups: dict[str | int, _Call] = {}  # by chunk id, claim index or "" (the answer)
        group = self._group
        keys = self.keys.fresh()  # chunks cited twice hashed once
        for p in pending:
            claim, index = p.claim, p.index
            q = self._question_for(claim, question)
            # What the judge answers for this claim: (unit, its chunks' ids, their texts).
            units: list[tuple[str, tuple[str, ...], tuple[str, ...]]]
            if self.pair_level:
                units = [(cid, (cid,), (text,)) for cid, text in p.chunks]
            else:
                units = [(WHOLE, tuple([c for c, _ in p.chunks]), tuple([t for _, t in p.chunks]))]
            for unit, ids, texts in units:
                key = keys.key(claim, texts, q)
                hit = cache.get(key)
                if hit is not None:
                    stats.cache_hits += 1
                    known[index][unit] = hit[0]
                    if hit[1]:
                        stats.rationales.setdefault(index, []).append(hit[1])
                    continue
                gkey = unit if group == "chunk" else index if group == "claim" else ""
                call = groups.get(gkey) if group is not None else None
                if call is None:
                    call = _Call({}, [], {})
                    calls.append(call)
                    if group is not None:
                        groups[gkey] = call
                call.chunks.update(zip(ids, texts, strict=True))
                cid = f"c{len(call.items) + 1}"
                call.items.append(CallItem(cid, claim, ids, q))
                call.targets[cid] = (index, unit, key)
        if self.backend != "tei":  # a classifier scores each pair on its own: no company
            calls = [c for c in calls if not self._shared_hit(c, cache, known, stats)]
        stats.cache_misses += sum(len(c.items) for c in calls)
        return calls, known

    @staticmethod
    def _shared_hit(
        call: _Call, cache: VerdictCache, known: dict[int, dict[str, str]], stats: JudgeStats
    ) -> bool:
        """Key a call of several claims by all it shows, and settle it from the cache when
        every verdict of that same call is there (True: no call needed)."""
        if len(call.items) < 2 or cache.entries <= 0:
            return False
        # The units' own keys, in the order shown, cover every claim, chunk text and question
        # of the call, and the cited ids name the passages; a position tells apart two claims
        # of the same text.
        whole = hashlib.blake2b(digest_size=20, person=b"judge call")
        for item, (_, _, key) in zip(call.items, call.targets.values(), strict=True):
            whole.update(key + len(item.chunks).to_bytes(4, "big"))
            for cid in item.chunks:
                b = cid.encode("utf-8", "surrogatepass")
                whole.update(len(b).to_bytes(8, "big") + b)
        hits: list[tuple[int, str, tuple[str, str] | None]] = []
        for n, (cid, (index, unit, _)) in enumerate(call.targets.items()):
            h = whole.copy()
            h.update(n.to_bytes(4, "big"))
            key = h.digest()
            call.targets[cid] = (index, unit, key)
            hits.append((index, unit, cache.get(key)))
        if any(hit is None for _, _, hit in hits):
            return False
        for index, unit, hit in hits:
            assert hit is not None
            stats.cache_hits += 1
            known[index][unit] = hit[0]
            if hit[1]:
                stats.rationales.setdefault(index, []).append(hit[1])
        return True

    # -- calls -------------------------------------------------------------------------------

    async def _call(
        self, client: JudgeClient, call: _Call, deadline: float, stats: JudgeStats
    ) -> Mapping[str, tuple[str, str]]:
        if self.backend == "tei":
            return await self._call_tei(client, call, deadline, stats)
        user = self.prompt.user(call.chunks, call.items)
        body = self.body.encode(user, client.json_schema)
        try:
            answer, _ = await client.post("/chat/completions", body, deadline, stats.calls)
        except JudgeError as e:
            if e.kind != "http_4xx_schema" or not client.json_schema:
                raise
            # The endpoint has no structured output: JSON mode, and the schema in the prompt.
            client.json_schema = False
            body = self.body.encode(user, False)
            answer, _ = await client.post("/chat/completions", body, deadline, stats.calls)
        content, usage = _chat_content(answer)
        if stats.calls:
            stats.calls[-1].usage = usage
        try:
            return self.prompt.parse(content, list(call.targets))
        except PromptFormatError as e:
            if stats.calls:
                stats.calls[-1].outcome = "bad_verdicts"
            raise JudgeError("bad_verdicts", str(e)) from None

    async def _call_tei(
        self, client: JudgeClient, call: _Call, deadline: float, stats: JudgeStats
    ) -> dict[str, tuple[str, str]]:
        ids = list(call.targets)
        pairs = []
        for item in call.items:
            (chunk_id,) = item.chunks
            pairs.append([call.chunks[chunk_id], item.claim])
        answer, _ = await client.post(
            "/predict", {"inputs": pairs, "raw_scores": False}, deadline, stats.calls
        )
        rows: Any = answer
        if len(pairs) == 1 and isinstance(rows, list) and rows and isinstance(rows[0], dict):
            rows = [rows]  # one pair: some servers answer with its score list alone
        if not isinstance(rows, list) or len(rows) != len(pairs):
            if stats.calls:
                stats.calls[-1].outcome = "bad_verdicts"
            raise JudgeError("bad_verdicts", "score lists do not match the pairs sent")
        out: dict[str, tuple[str, str]] = {}
        wanted = self.spec.label.lower()
        for cid, scores in zip(ids, rows, strict=True):
            score = _label_score(scores, wanted)
            if score is None:
                if stats.calls:
                    stats.calls[-1].outcome = "bad_verdicts"
                raise JudgeError(
                    "bad_verdicts", f"not exactly one {self.spec.label!r} score for a pair"
                )
            out[cid] = ("YES" if score >= self.spec.threshold else "NO", f"{wanted}={score:.3f}")
        return out

    # -- the pass ----------------------------------------------------------------------------

    async def run(
        self, pending: Sequence[Pending], question: str | None, deadline: float
    ) -> tuple[dict[int, CheckResult], JudgeStats]:
        """One CheckResult per pending claim (by index), and what it took."""
        t0 = time.monotonic()
        stats = JudgeStats(self.prompt_version, self.model)
        client = self.client  # once per answer: the lookup is not free
        calls, known = self.plan(pending, question, stats, client)
        errors: dict[int, str] = {}
        if calls:
            outcomes = await self._settle(client, calls, deadline, stats)
            for call, outcome in zip(calls, outcomes, strict=True):
                if isinstance(outcome, Exception):
                    kind = outcome.kind if isinstance(outcome, JudgeError) else "crash"
                else:
                    for cid, (label, why) in outcome.items():
                        index, unit, key = call.targets[cid]
                        known[index][unit] = label
                        client.cache.put(key, label, why)
                        if why:
                            stats.rationales.setdefault(index, []).append(why)
                    continue
                for index, _, _ in call.targets.values():
                    errors.setdefault(index, kind)
        stats.seconds = time.monotonic() - t0
        stats.circuit_open = client.circuit.state != "closed"
        results: dict[int, CheckResult] = {}
        tally = stats.verdicts
        for p in pending:
            labels = known[p.index]
            said = labels.values()
            for label in said:
                tally[label] = tally.get(label, 0) + 1
            if not self.yes.isdisjoint(said):
                results[p.index] = _PASSED
                verdict = "YES"
            elif p.index in errors:
                results[p.index] = CheckResult.error(CHECK, f"judge_{errors[p.index]}")
                verdict = "error"
            else:
                # Every unit answered, and none said YES (PARTIAL counts as NO unless on_partial).
                results[p.index] = CheckResult.fail(
                    CHECK, "unsupported", "judge: " + ",".join(sorted(set(said)))
                )
                verdict = "PARTIAL" if "PARTIAL" in said else "NO"
            stats.claims.append({"index": p.index, "verdict": verdict, "labels": labels})
        return results, stats

    async def _settle(
        self, client: JudgeClient, calls: list[_Call], deadline: float, stats: JudgeStats
    ) -> list[_Outcome]:
        """Every call's outcome, in order. The client ends every wait of a call by the answer's
        deadline (a concurrency slot, each attempt, a retry's backoff: `JudgeClient.post`), so
        no timer of the pass's own is needed; a cancelled pass cancels its calls."""

        async def settle(call: _Call) -> _Outcome:
            try:
                return await self._call(client, call, deadline, stats)
            except Exception as e:  # this call's failure, an infrastructure error for its claims
                return e

        if len(calls) == 1:
            return [await settle(calls[0])]  # the usual answer: no task of its own to schedule
        return list(await asyncio.gather(*map(settle, calls)))


def _label_score(scores: object, wanted: str) -> float | None:
    """The score of label `wanted` (lower case) in one pair's score list, matched in any case;
    None unless exactly one entry names it with a number from 0 to 1. Two entries for it
    ("entailment" 0.02, "ENTAILMENT" 0.99) leave the score the classifier meant ambiguous:
    never the last one."""
    if not isinstance(scores, list):
        return None
    found: float | None = None
    for s in scores:
        if isinstance(s, dict):
            label = s.get("label")
            if isinstance(label, str) and label.lower() == wanted:
                score = s.get("score")
                if found is not None or isinstance(score, bool):
                    return None
                # A probability: a score outside [0, 1] (or NaN) is no answer to read.
                if not isinstance(score, int | float) or not 0.0 <= score <= 1.0:
                    return None
                found = float(score)
    return found


def _chat_content(answer: object) -> tuple[str, dict[str, int]]:
    """The assistant text of a chat completion, and its token usage."""
    try:
        assert isinstance(answer, dict)
        message = answer["choices"][0]["message"]
        content = message["content"]
        if not isinstance(content, str):
            raise TypeError
    except (AssertionError, KeyError, IndexError, TypeError):
        raise JudgeError("bad_response", "not a chat completion") from None
    usage: dict[str, int] = {}
    u = answer.get("usage")
    if isinstance(u, dict):
        for src, kind in (("prompt_tokens", "prompt"), ("completion_tokens", "completion")):
            v = u.get(src)
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                usage[kind] = v
    return content, usage
