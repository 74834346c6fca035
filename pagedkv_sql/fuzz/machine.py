"""The rules every engine's fuzz machine shares (a new request sharing an earlier prompt's
prefix, a step of prefill or decode, finish, preempt, resume, a prefix-cache reset) and the
invariant checked after each: a hypothesis ``RuleBasedStateMachine`` each engine subclasses
with what a rule does to it."""

from __future__ import annotations

from typing import Any, TextIO

from .core import Call, Stats, check, hypothesis_module

__all__ = ["base_machine"]


def base_machine(stats: Stats, block_size: int, chunk: int) -> Any:
    """The RuleBasedStateMachine every engine's machine subclasses: the rules (a new request
    sharing a random earlier prompt's prefix, a step of prefill chunk or decode, finish,
    preempt, resume, reset the prefix cache), the schedule of the example running now
    (``last``), and the invariant (``capture()`` checked after every step). A subclass
    defines ``start`` (its @initialize: the engine built, then ``begin()``) and what each
    rule does to the engine: ``add``, ``schedule``, ``tokens_left``, ``grow``,
    ``finish_request``, ``preempt_request``, ``reset``; and ``capture``, ``recorder(out)``,
    ``end_step(recorder)``."""
    hypothesis_module()
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

    class Machine(RuleBasedStateMachine):
        last: list[Call] = []  # noqa: RUF012  # the example running now, per subclass
        started = False

        def begin(self) -> None:
            stats.on_time()
            stats.examples += 1
            type(self).last = []
            stats.calls = type(self).last
            self.running: list[str] = []
            self.waiting: list[str] = []
            self.prompts: list[list[int]] = []
            self.n = 0
            self.started = True

        def _log(self, text: str, rule: str, **args: Any) -> None:
            type(self).last.append(Call(text, rule, args))

        def todo(self, rid: str) -> int:
            """The tokens the request's next step computes: the rest of its prompt (at
            most a chunk), or the token sampled last."""
            left = int(self.tokens_left(rid))
            return min(chunk, left) if chunk else left

        # -- what a subclass does to its engine ----------------------------------------------
        def add(self, rid: str, prompt: list[int]) -> None:
            raise NotImplementedError

        def schedule(self, rid: str) -> bool:
            raise NotImplementedError

        def tokens_left(self, rid: str) -> int:
            raise NotImplementedError

        def grow(self, rid: str, todo: int) -> bool:
            raise NotImplementedError

        def finish_request(self, rid: str) -> None:
            raise NotImplementedError

        def preempt_request(self, rid: str) -> None:
            raise NotImplementedError

        def reset(self) -> bool:
            raise NotImplementedError

        def capture(self) -> Any:
            raise NotImplementedError

        def recorder(self, out: TextIO) -> Any:
            raise NotImplementedError

        def unreplayable(self) -> str | None:
            """Why replay refuses this engine's step log, or None (it replays it)."""
            return None

        def end_step(self, recorder: Any) -> None:
            recorder.step()

        # -- the rules -----------------------------------------------------------------------
        @rule(share=st.integers(0, 64), extra=st.integers(1, 3 * block_size))
        def new_request(self, share: int, extra: int) -> None:
            """A prompt of the first ``share`` tokens of an earlier one (picked by
            ``share`` too), then ``extra`` tokens no prompt had."""
            base = self.prompts[share % len(self.prompts)] if self.prompts and share else []
            prompt = base[:share] + [1000 + self.n * 50 + i for i in range(extra)]
            rid = f"r{self.n}"
            self.n += 1
            self.prompts.append(prompt)
            shared = min(share, len(base))
            self._log(
                f"new {rid} prompt {len(prompt)} tokens sharing {shared}",
                "new_request",
                share=share,
                extra=extra,
            )
            self.add(rid, prompt)
            (self.running if self.schedule(rid) else self.waiting).append(rid)

        @rule(pick=st.integers(0, 63))
        def step(self, pick: int) -> None:
            if not self.running:
                return
            rid = self.running[pick % len(self.running)]
            todo = self.todo(rid)
            self._log(f"step {rid} ({todo} tokens)", "step", pick=pick)
            if self.grow(rid, todo):
                stats.counts["decodes" if todo == 1 else "prefill chunks"] += 1

        @rule(pick=st.integers(0, 63))
        def finish(self, pick: int) -> None:
            if not self.running:
                return
            rid = self.running.pop(pick % len(self.running))
            self._log(f"finish {rid}", "finish", pick=pick)
            self.finish_request(rid)
            stats.counts["finished"] += 1

        @rule(pick=st.integers(0, 63))
        def preempt(self, pick: int) -> None:
            if not self.running:
                return
            rid = self.running.pop(pick % len(self.running))
            self._log(f"preempt {rid}", "preempt", pick=pick)
            self.preempt_request(rid)
            self.waiting.append(rid)
            stats.counts["preemptions"] += 1

        @rule(pick=st.integers(0, 63))
        def resume(self, pick: int) -> None:
            if not self.waiting:
                return
            rid = self.waiting[pick % len(self.waiting)]
            self._log(f"resume {rid}", "resume", pick=pick)
            if self.schedule(rid):
                self.waiting.remove(rid)
                self.running.append(rid)
                stats.counts["resumed"] += 1

        @rule(when=st.integers(0, 7))
        def reset_prefix_cache(self, when: int) -> None:
            if when or self.running:
                return  # rarely, and while nothing runs (both engines refuse then)
            self._log("reset prefix cache", "reset_prefix_cache", when=when)
            if self.reset():
                stats.counts["prefix cache resets"] += 1

        @invariant()
        def consistent(self) -> None:
            stats.on_time()
            if self.started:
                check(self.capture, stats)

    return Machine
