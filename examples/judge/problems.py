"""The problems the example ships with, and solutions that earn each verdict.

``SOLUTIONS[problem_id][verdict]`` is source code that the sandbox judges with that verdict:
an accepted solution for every problem, and across problems a wrong answer, an infinite loop
and a too-slow algorithm (time limit), an exception (runtime error), a huge allocation (memory
limit) and two syntax errors (compile error).
"""

from __future__ import annotations

from typing import Any

from sqlmodel import Session

from .models import Problem, Verdict

__all__ = ["PROBLEM_SPECS", "SOLUTIONS", "make_problem", "make_problems", "seed_problems"]


def _case(input_: str, expected: str) -> dict[str, str]:
    return {"input": input_, "expected": expected}


#: Plain data, so each caller builds its own (session-independent) Problem rows.
PROBLEM_SPECS: list[dict[str, Any]] = [
    {
        "id": "a-plus-b",
        "title": "A + B: print the sum of two integers given on one line",
        "tests": [
            _case("1 2\n", "3"),
            _case("-5 5\n", "0"),
            _case("1000000000 1000000000\n", "2000000000"),
            _case("123456789012345678 1\n", "123456789012345679"),
        ],
    },
    {
        "id": "reverse-string",
        "title": "Reverse a line of text",
        "time_limit_ms": 500,
        "tests": [
            _case("hello\n", "olleh"),
            _case("racecar\n", "racecar"),
            _case("durable tasks\n", "sksat elbarud"),
        ],
    },
    {
        "id": "fibonacci",
        "title": "Print F(n) for 0 <= n <= 90, with F(0) = 0 and F(1) = 1",
        "tests": [
            _case("0\n", "0"),
            _case("1\n", "1"),
            _case("10\n", "55"),
            _case("50\n", "12586269025"),
            _case("90\n", "2880067194370816120"),
        ],
    },
    {
        "id": "sum-list",
        "title": "Sum of a list: n on the first line, n integers on the second",
        "tests": [
            _case("3\n1 2 3\n", "6"),
            _case("1\n-7\n", "-7"),
            _case("5\n10 20 30 40 50\n", "150"),
            _case("0\n\n", "0"),
        ],
    },
    {
        "id": "max-subarray",
        "title": "Largest sum of a non-empty contiguous subarray: n, then n integers",
        "tests": [
            _case("9\n-2 1 -3 4 -1 2 1 -5 4\n", "6"),
            _case("1\n-3\n", "-3"),
            _case("5\n-1 -2 -3 -4 -5\n", "-1"),
            _case("4\n5 4 -1 7\n", "15"),
            _case("6\n2 -1 2 -1 2 -1\n", "4"),
        ],
    },
    {
        "id": "is-prime",
        "title": "Is n prime (1 <= n <= 10^12)? Print YES or NO",
        "tests": [
            _case("1\n", "NO"),
            _case("2\n", "YES"),
            _case("97\n", "YES"),
            _case("100\n", "NO"),
            _case("999999999989\n", "YES"),
            _case("1000000000000\n", "NO"),
        ],
    },
    {
        "id": "word-count",
        "title": "Count the whitespace-separated words of the input",
        "tests": [
            _case("hello world\n", "2"),
            _case("  spaces   everywhere  \n", "2"),
            _case("one\ntwo three\n\nfour\n", "4"),
            _case("\n", "0"),
        ],
    },
    {
        "id": "sort-numbers",
        "title": "Sort n integers in ascending order: n, then the integers",
        "tests": [
            _case("5\n3 1 4 1 5\n", "1 1 3 4 5"),
            _case("1\n42\n", "42"),
            _case("4\n-1 -10 7 0\n", "-10 -1 0 7"),
            _case("6\n9 8 7 6 5 4\n", "4 5 6 7 8 9"),
        ],
    },
    {
        "id": "gcd",
        "title": "Greatest common divisor of two non-negative integers (not both zero)",
        "tests": [
            _case("12 18\n", "6"),
            _case("17 5\n", "1"),
            _case("0 9\n", "9"),
            _case("1000000007 1000000007\n", "1000000007"),
            _case("48 180\n", "12"),
        ],
    },
]


def make_problem(problem_id: str) -> Problem:
    """A new (unsaved) Problem row for one shipped problem."""
    for spec in PROBLEM_SPECS:
        if spec["id"] == problem_id:
            return Problem.model_validate(spec)
    raise KeyError(problem_id)


def make_problems() -> list[Problem]:
    """New (unsaved) Problem rows for every shipped problem."""
    return [Problem.model_validate(spec) for spec in PROBLEM_SPECS]


def seed_problems(session: Session) -> int:
    """Insert the shipped problems that are missing and commit; returns how many were added.

    Existing rows are left alone: an operator may have edited them.
    """
    added = 0
    for problem in make_problems():
        if session.get(Problem, problem.id) is None:
            session.add(problem)
            added += 1
    session.commit()
    return added


_READ_NUMBERS = (
    "import sys\n\ndata = sys.stdin.read().split()\nn = int(data[0])\nnumbers = [int(x) for x in data[1 : 1 + n]]\n"
)

SOLUTIONS: dict[str, dict[Verdict, str]] = {
    "a-plus-b": {
        Verdict.ACCEPTED: "a, b = map(int, input().split())\nprint(a + b)\n",
        Verdict.WRONG_ANSWER: "a, b = map(int, input().split())\nprint(a - b)\n",
        Verdict.COMPILE_ERROR: "a, b = map(int, input().split())\nprint(a + b\n",
    },
    "reverse-string": {
        Verdict.ACCEPTED: "print(input()[::-1])\n",
        # An infinite loop: killed at the wall-clock limit.
        Verdict.TIME_LIMIT_EXCEEDED: "s = input()\nwhile True:\n    s = s[::-1]\n",
    },
    "fibonacci": {
        Verdict.ACCEPTED: "n = int(input())\na, b = 0, 1\nfor _ in range(n):\n    a, b = b, a + b\nprint(a)\n",
        # No base case: RecursionError on every input.
        Verdict.RUNTIME_ERROR: "def fib(n):\n    return fib(n - 1) + fib(n - 2)\n\nprint(fib(int(input())))\n",
    },
    "sum-list": {
        Verdict.ACCEPTED: _READ_NUMBERS + "print(sum(numbers))\n",
        # Off by one: skips the last number (still right for the empty list).
        Verdict.WRONG_ANSWER: _READ_NUMBERS + "print(sum(numbers[:-1]))\n",
    },
    "max-subarray": {
        Verdict.ACCEPTED: _READ_NUMBERS
        + "best = current = numbers[0]\nfor x in numbers[1:]:\n"
        + "    current = max(x, current + x)\n    best = max(best, current)\nprint(best)\n",
        # Allows the empty subarray: prints 0 when every number is negative.
        Verdict.WRONG_ANSWER: _READ_NUMBERS
        + "best = current = 0\nfor x in numbers:\n"
        + "    current = max(0, current + x)\n    best = max(best, current)\nprint(best)\n",
    },
    "is-prime": {
        Verdict.ACCEPTED: "n = int(input())\n"
        + "def is_prime(n):\n    if n < 2:\n        return False\n    if n % 2 == 0:\n        return n == 2\n"
        + "    d = 3\n    while d * d <= n:\n        if n % d == 0:\n            return False\n        d += 2\n"
        + "    return True\n\nprint('YES' if is_prime(n) else 'NO')\n",
        # Trial division up to n: fine for small n, far too slow for the 12-digit prime.
        Verdict.TIME_LIMIT_EXCEEDED: "n = int(input())\n"
        + "print('YES' if n >= 2 and all(n % d for d in range(2, n)) else 'NO')\n",
    },
    "word-count": {
        Verdict.ACCEPTED: "import sys\n\nprint(len(sys.stdin.read().split()))\n",
        Verdict.RUNTIME_ERROR: "raise NotImplementedError('left as an exercise')\n",
    },
    "sort-numbers": {
        Verdict.ACCEPTED: _READ_NUMBERS + "print(' '.join(map(str, sorted(numbers))))\n",
        # A counting sort over every possible value: a billion-slot list.
        Verdict.MEMORY_LIMIT_EXCEEDED: _READ_NUMBERS
        + "counts = [0] * (2 * 10**9)\nfor x in numbers:\n    counts[x + 10**9] += 1\n"
        + "print(' '.join(str(i - 10**9) for i, c in enumerate(counts) for _ in range(c)))\n",
    },
    "gcd": {
        Verdict.ACCEPTED: "import math\n\na, b = map(int, input().split())\nprint(math.gcd(a, b))\n",
        Verdict.COMPILE_ERROR: "def gcd(a, b)\n    return a if b == 0 else gcd(b, a % b)\n\n"
        + "print(gcd(*map(int, input().split())))\n",
    },
}
