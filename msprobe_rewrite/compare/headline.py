"""Why the first suspect and the first divergence name different entries.

compare answers with two views: the first suspect (the propagation view, ``propagation``) is the headline,
and the first divergence (the first entry past its dtype's threshold) is shown below it as the threshold
view. When they name different entries, a reader who sees two operators needs to know which to believe and
why the other one differs; before, the terminal printed both one after the other with no word on how they
relate (tests/compare/test_headline.py). ``relate`` says it, from the two entries' places in execution order.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

# (pair label, merged position) -> the entry's place in execution order (completion order), None if unknown
OrderOf = Callable[[str, int], Optional[Tuple[int, int]]]


def _same_dump(first: Dict[str, Any], suspect: Dict[str, Any]) -> bool:
    return first.get("pair") == suspect.get("pair")


def relate(first: Optional[Dict[str, Any]], suspect: Optional[Dict[str, Any]], order_of: OrderOf) -> Dict[str, Any]:
    """``{"same": bool, "reason": str}``: whether both views name the same entry, and if not, why not."""
    if first is None and suspect is None:
        return {"same": True, "reason": "neither view names an entry: the runs agree"}
    if suspect is None:
        if first.get("kind") == "inputs":
            why = (
                "its inputs already diverge: the difference entered through code the dump does not record, "
                "and no recorded entry puts in more error than its inputs and the noise floor explain"
            )
        else:
            why = (
                "its output error is within what its inputs' error, its op's allowance and the noise floor "
                "explain: the threshold counts propagated error and rounding noise, the suspect view does not"
            )
        return {"same": False, "reason": f"{first['entry']} crosses its threshold, but {why}"}
    if first is None:
        return {
            "same": False,
            "reason": f"{suspect['entry']} puts in more error than its inputs explain, but every error stays "
            "below its dtype's threshold (a smaller --threshold shows it as a divergence)",
        }
    if _same_dump(first, suspect) and first.get("position") == suspect.get("position"):
        return {"same": True, "reason": "both views name the same entry"}
    if not _same_dump(first, suspect):
        return {
            "same": False,
            "reason": f"they are in different dumps: the first threshold crossing is in {first['pair']}, "
            f"the first suspect in {suspect['pair']} (dumps are taken in step order, then rank order)",
        }
    first_at = order_of(first["pair"], first["position"])
    suspect_at = order_of(suspect["pair"], suspect["position"])
    if first_at is not None and suspect_at is not None and suspect_at < first_at:
        return {
            "same": False,
            "reason": f"{suspect['entry']} runs first and puts the error in, but its error stays below the "
            f"threshold; the error crosses the threshold later, at {first['entry']}, through ops "
            "that pass it on (their output error is explained by their inputs')",
        }
    if first.get("kind") == "inputs":
        why = (
            "its inputs already diverge (the difference entered through code the dump does not record) and "
            "its output error is what they explain"
        )
    else:
        why = (
            "its output error is within what its inputs' error, its op's allowance and the noise floor "
            "explain (rounding that the threshold counts)"
        )
    return {
        "same": False,
        "reason": f"{first['entry']} crosses the threshold before {suspect['entry']}, but {why}; "
        f"{suspect['entry']} is the first whose output error its inputs do not explain",
    }
