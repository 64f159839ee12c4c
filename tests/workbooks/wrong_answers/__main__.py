"""``python -m tests.workbooks.wrong_answers``: run every wrong and right answer through its check
and print, per exercise, how many wrong answers were caught with their hint, how many hints name
the mistake, and how many right variants passed. Exit status 1 when a target is missed."""

from __future__ import annotations

import contextlib
import io
import sys

from . import MIN_NAMED_SHARE, MIN_WRONG_PER_EXERCISE, collect


def _outcome(item) -> tuple[bool, str]:
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            item.run()
        except AssertionError as err:
            return False, str(err)
        except Exception as err:  # noqa: BLE001 - a crash of the check is reported, not hidden
            return False, f"CRASH {type(err).__name__}: {err}"
    return True, ""


def main() -> int:
    wrong, right = collect()
    rows: dict[str, dict[str, int]] = {}
    problems: list[str] = []
    for w in wrong:
        r = rows.setdefault(w.exercise, {"wrong": 0, "caught": 0, "named": 0, "right": 0, "accepted": 0})
        r["wrong"] += 1
        ok, message = _outcome(w)
        if not ok and w.hint in message and not message.startswith("CRASH"):
            r["caught"] += 1
            r["named"] += w.names_mistake
        else:
            problems.append(f"{w.exercise} {w.mistake!r}: " + ("passed its check" if ok else "wrong hint or crash"))
    for rt in right:
        r = rows.setdefault(rt.exercise, {"wrong": 0, "caught": 0, "named": 0, "right": 0, "accepted": 0})
        r["right"] += 1
        ok, message = _outcome(rt)
        r["accepted"] += ok
        if not ok:
            problems.append(f"{rt.exercise} right variant {rt.how!r} rejected: {message.splitlines()[0] if message else ''}")
    print(f"{'exercise':<9}{'wrong':>6}{'caught':>8}{'named':>7}{'right':>7}{'accepted':>10}")
    total = {"wrong": 0, "caught": 0, "named": 0, "right": 0, "accepted": 0}
    for ex in sorted(rows):
        r = rows[ex]
        print(f"{ex:<9}{r['wrong']:>6}{r['caught']:>8}{r['named']:>7}{r['right']:>7}{r['accepted']:>10}")
        for k in total:
            total[k] += r[k]
        if r["wrong"] < MIN_WRONG_PER_EXERCISE:
            problems.append(f"{ex}: {r['wrong']} wrong answers (target ≥ {MIN_WRONG_PER_EXERCISE})")
    share = total["named"] / max(total["wrong"], 1)
    print(f"{'all':<9}{total['wrong']:>6}{total['caught']:>8}{total['named']:>7}{total['right']:>7}{total['accepted']:>10}")
    print(f"caught {total['caught']}/{total['wrong']}; hints naming the mistake {share:.0%} "
          f"(target ≥ {MIN_NAMED_SHARE:.0%}); right variants accepted {total['accepted']}/{total['right']}")
    if share < MIN_NAMED_SHARE:
        problems.append(f"named share {share:.0%} < {MIN_NAMED_SHARE:.0%}")
    for p in problems:
        print("MISSED:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
