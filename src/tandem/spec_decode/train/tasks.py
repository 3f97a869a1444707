"""Training prompts in the shape of a code-completion benchmark, written here: small programming tasks as a
typed signature plus a docstring with examples, the examples *computed* by running a reference
implementation on seeded random inputs (so they are right).

Drafters are evaluated on HumanEval, which is never read here (held out). What the drafter must predict is the
target's own continuation of such a prompt (a body, a copy of the signature and docstring, test calls, prose),
and that differs enough from the continuation of a standard-library docstring to halve acceptance; these
prompts cover the shape without the benchmark's text. Deterministic for a seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

R = random.Random


def _ints(r: R, lo: int = -9, hi: int = 9, n: tuple[int, int] = (2, 7)) -> list[int]:
    return [r.randint(lo, hi) for _ in range(r.randint(*n))]


def _word(r: R) -> str:
    return r.choice("apple banana cherry dog eagle fish grape house ice jam kite lemon moon night orange "
                    "pear queen river sun tree umbrella violet water xray yellow zebra".split())


def _words(r: R) -> list[str]:
    return [_word(r) for _ in range(r.randint(2, 5))]


def _sentence(r: R) -> str:
    return " ".join(_words(r))


def _text(r: R) -> str:
    return r.choice(["hello world", "Python", "abcba", "racecar", "Data Science", "openai", "level",
                     "Hello, World!", "aabbcc", "xyz", "banana", "Mississippi", "noon", "stats"])


@dataclass(frozen=True)
class Family:
    names: tuple[str, ...]
    params: str  # the signature's parameter list, typed
    returns: str
    docs: tuple[str, ...]
    fn: Callable[..., Any]
    gen: Callable[[R], tuple[Any, ...]]


F = Family
FAMILIES: tuple[Family, ...] = (
    F(("sum_even", "sum_of_evens", "add_even_numbers"), "numbers: List[int]", "int",
      ("Return the sum of the even numbers in the given list.",
       "Given a list of integers, add up the ones that are even and return the total."),
      lambda xs: sum(x for x in xs if x % 2 == 0), lambda r: (_ints(r),)),
    F(("count_vowels", "vowel_count", "number_of_vowels"), "s: str", "int",
      ("Count the vowels (a, e, i, o, u, either case) in the string s.",
       "Write a function that returns how many vowels the input string contains."),
      lambda s: sum(c in "aeiouAEIOU" for c in s), lambda r: (_text(r),)),
    F(("reverse_words", "reverse_sentence", "words_backwards"), "sentence: str", "str",
      ("Return the words of the sentence in reverse order, separated by single spaces.",
       "Split the text on spaces and give the words back last-to-first, joined by one space."),
      lambda s: " ".join(reversed(s.split())), lambda r: (_sentence(r),)),
    F(("reads_same_reversed", "check_palindrome", "mirror_string"), "text: str", "bool",
      ("Decide whether text equals its own reversal.",
       "Return True if the string reads the same forwards and backwards, False otherwise."),
      lambda s: s == s[::-1], lambda r: (_text(r),)),
    F(("max_difference", "largest_gap", "max_spread"), "numbers: List[int]", "int",
      ("Return the difference between the largest and the smallest number in the list.",
       "Compute max(numbers) - min(numbers); the list has at least one element."),
      lambda xs: max(xs) - min(xs), lambda r: (_ints(r),)),
    F(("keep_with_prefix", "starting_with", "select_prefix"), "words: List[str], start: str", "List[str]",
      ("Keep the words whose first letters are start.",
       "Return the words of the list that begin with start, in their original order."),
      lambda xs, p: [x for x in xs if x.startswith(p)], lambda r: (_words(r), r.choice("abcdefgmnopst"))),
    F(("filter_by_length", "long_words", "words_longer_than"), "strings: List[str], n: int", "List[str]",
      ("Return the strings that are longer than n characters.",
       "Given a list of strings and an integer n, keep only the strings whose length is greater than n."),
      lambda xs, n: [x for x in xs if len(x) > n], lambda r: (_words(r), r.randint(3, 6))),
    F(("running_max", "max_so_far", "prefix_maximum"), "numbers: List[int]", "List[int]",
      ("Walk through the list and record, at each position, the biggest value met up to there.",
       "Return a list where element i is the maximum of numbers[0..i]."),
      lambda xs: [max(xs[: i + 1]) for i in range(len(xs))], lambda r: (_ints(r),)),
    F(("drop_repeats", "unique_in_order", "dedupe"), "numbers: List[int]", "List[int]",
      ("Keep only the first time each value shows up, preserving the original order.",
       "Return the list without repeated values, keeping the first occurrence of each."),
      lambda xs: list(dict.fromkeys(xs)), lambda r: (_ints(r, 1, 5, (3, 8)),)),
    F(("count_char", "char_occurrences", "count_letter"), "s: str, ch: str", "int",
      ("How often does the character ch show up in s? Return that count.",
       "Count how many times a given character occurs in the string."),
      lambda s, c: s.count(c), lambda r: (_text(r), r.choice("aeilnos"))),
    F(("factorial", "fact", "compute_factorial"), "n: int", "int",
      ("Return n! (the product of the integers from 1 to n). 0! is 1.",
       "Compute the factorial of a non-negative integer n."),
      math.factorial, lambda r: (r.randint(0, 8),)),
    F(("fibonacci_number", "fibonacci", "nth_fibonacci"), "n: int", "int",
      ("Compute F(n) where F(0) = 0, F(1) = 1 and F(k) = F(k-1) + F(k-2).",
       "The Fibonacci sequence starts 0, 1, 1, 2, 3, 5, ... Return its n-th element."),
      lambda n: _fib(n), lambda r: (r.randint(1, 15),)),
    F(("prime_test", "check_prime", "is_prime_number"), "n: int", "bool",
      ("A number is prime when it is above 1 and has no divisor other than 1 and itself; test n.",
       "Determine whether n is a prime number."),
      lambda n: n > 1 and all(n % d for d in range(2, int(n**0.5) + 1)), lambda r: (r.randint(1, 60),)),
    F(("highest_common_factor", "gcd_of", "common_divisor"), "a: int, b: int", "int",
      ("Use Euclid's algorithm to get the largest factor a and b share.",
       "Find the largest integer that divides both a and b."),
      math.gcd, lambda r: (r.randint(2, 60), r.randint(2, 60))),
    F(("digit_sum", "sum_of_digits", "add_digits"), "n: int", "int",
      ("Return the sum of the decimal digits of the non-negative integer n.",
       "Given a positive integer, add its digits together."),
      lambda n: sum(int(d) for d in str(n)), lambda r: (r.randint(0, 99999),)),
    F(("flatten", "flatten_list", "concat_lists"), "lists: List[List[int]]", "List[int]",
      ("Flatten a list of lists into one list, keeping the order.",
       "Concatenate the inner lists into a single list."),
      lambda xs: [y for x in xs for y in x], lambda r: ([_ints(r, 0, 9, (0, 3)) for _ in range(r.randint(2, 4))],)),
    F(("square_all", "squares", "square_elements"), "numbers: List[int]", "List[int]",
      ("Return a list with the square of every element.",
       "Square each number of the input list and return the new list."),
      lambda xs: [x * x for x in xs], lambda r: (_ints(r),)),
    F(("second_largest", "next_largest", "runner_up"), "numbers: List[int]", "Optional[int]",
      ("Give the runner-up value among the distinct numbers, or None when fewer than two distinct values exist.",
       "Sort the distinct values and take the one just below the top; None if there is only one."),
      lambda xs: sorted(set(xs))[-2] if len(set(xs)) > 1 else None, lambda r: (_ints(r, 0, 9, (1, 6)),)),
    F(("capitalize_words", "title_case", "capitalize_each"), "sentence: str", "str",
      ("Capitalize the first letter of every word in the sentence.",
       "Return the sentence with each word starting with an upper-case letter."),
      lambda s: " ".join(w.capitalize() for w in s.split()), lambda r: (_sentence(r),)),
    F(("word_count", "count_words", "number_of_words"), "text: str", "int",
      ("Return the number of words in text (words are separated by spaces).",
       "Count the words of a sentence."),
      lambda s: len(s.split()), lambda r: (_sentence(r),)),
    F(("pick_longest", "longest_string", "find_longest"), "strings: List[str]", "Optional[str]",
      ("Pick the string with the most characters; on a tie the earliest wins, and an empty input gives None.",
       "Find the longest string of the list (the first of equal ones); None for an empty list."),
      lambda xs: max(xs, key=len) if xs else None, lambda r: (_words(r) if r.random() < 0.8 else [],)),
    F(("mean", "average", "arithmetic_mean"), "numbers: List[float]", "float",
      ("Return the arithmetic mean of a list of numbers.",
       "Add the values up and divide by how many there are."),
      lambda xs: sum(xs) / len(xs), lambda r: ([float(x) for x in _ints(r, 0, 10)],)),
    F(("rotate_left", "rotate_list", "shift_left"), "items: List[int], k: int", "List[int]",
      ("Rotate the list left by k positions.",
       "Move the first k elements of the list to its end and return the result."),
      lambda xs, k: xs[k % len(xs):] + xs[: k % len(xs)], lambda r: (_ints(r, 0, 9), r.randint(0, 4))),
    F(("pairwise_sums", "adjacent_sums", "neighbour_sums"), "numbers: List[int]", "List[int]",
      ("Return the sums of each pair of adjacent elements.",
       "Given a list, build the list of numbers[i] + numbers[i + 1]."),
      lambda xs: [a + b for a, b in zip(xs, xs[1:])], lambda r: (_ints(r),)),
    F(("insert_between", "insert_separator", "join_with"), "items: List[int], sep: int", "List[int]",
      ("Put sep between each neighbouring pair of items.",
       "Return a new list where the separator value sits between consecutive items."),
      lambda xs, d: [y for i, x in enumerate(xs) for y in ((x,) if i == 0 else (d, x))],
      lambda r: (_ints(r, 0, 9, (0, 4)), r.randint(0, 9))),
    F(("string_lengths", "lengths", "word_lengths"), "strings: List[str]", "List[int]",
      ("Return the length of each string in the list.",
       "Map every string of the input list to its number of characters."),
      lambda xs: [len(x) for x in xs], lambda r: (_words(r),)),
    F(("only_positive", "positives", "keep_positive"), "numbers: List[int]", "List[int]",
      ("Drop zero and the negatives, keep the rest in order.",
       "Filter the list, keeping the numbers greater than zero."),
      lambda xs: [x for x in xs if x > 0], lambda r: (_ints(r),)),
    F(("product", "multiply_all", "list_product"), "numbers: List[int]", "int",
      ("Return the product of all the numbers in the list (1 for an empty list).",
       "Multiply the elements of the list together."),
      lambda xs: math.prod(xs), lambda r: (_ints(r, 1, 6, (0, 5)),)),
    F(("sort_by_length", "order_by_length", "sort_strings"), "strings: List[str]", "List[str]",
      ("Sort the strings by length, shortest first; strings of equal length keep their order.",
       "Return the list of strings ordered by increasing length."),
      lambda xs: sorted(xs, key=len), lambda r: (_words(r),)),
    F(("sorted_distinct", "sorted_unique", "distinct_sorted"), "values: List[int]", "List[int]",
      ("Give the different values in increasing order, each once.",
       "Remove repeated elements and return the rest in increasing order."),
      lambda xs: sorted(set(xs)), lambda r: (_ints(r, 0, 9, (3, 9)),)),
    F(("shared_values", "common_elements", "in_both"), "first: List[int], second: List[int]", "List[int]",
      ("Which values occur in both inputs? Return them ascending, no duplicates.",
       "Find the values that appear in both lists, sorted and without repeats."),
      lambda a, b: sorted(set(a) & set(b)), lambda r: (_ints(r, 0, 9), _ints(r, 0, 9))),
    F(("to_binary", "as_binary", "binary_string"), "n: int", "str",
      ("Convert a non-negative integer to its binary representation as a string.",
       "Return the base-2 digits of n, without a prefix."),
      lambda n: bin(n)[2:], lambda r: (r.randint(0, 64),)),
    F(("count_capitals", "uppercase_count", "capital_letters"), "s: str", "int",
      ("Return the number of upper-case letters in s.",
       "Count the capital letters of the string."),
      lambda s: sum(c.isupper() for c in s), lambda r: (_text(r),)),
    F(("replace_spaces", "snake_spaces", "underscore_spaces"), "text: str", "str",
      ("Replace every space in the text with an underscore.",
       "Given a string text, return it with all spaces changed to '_'."),
      lambda s: s.replace(" ", "_"), lambda r: (_sentence(r),)),
    F(("in_order", "sorted_ascending", "non_decreasing"), "numbers: List[int]", "bool",
      ("Return True if the list is sorted in ascending order.",
       "Check whether every element is less than or equal to the next one."),
      lambda xs: all(a <= b for a, b in zip(xs, xs[1:])),
      lambda r: (sorted(_ints(r)) if r.random() < 0.5 else _ints(r),)),
    F(("celsius_to_fahrenheit", "to_fahrenheit", "convert_temperature"), "celsius: float", "float",
      ("Convert a temperature from Celsius to Fahrenheit.",
       "Return the temperature in degrees Fahrenheit for the given degrees Celsius."),
      lambda c: c * 9 / 5 + 32, lambda r: (float(r.choice([-40, 0, 10, 20, 25, 30, 100])),)),
    F(("min_max", "find_min_max", "extremes"), "values: List[int]", "Tuple[int, int]",
      ("Return a tuple of the smallest and the largest number of the list.",
       "Given a non-empty list, find (minimum, maximum)."),
      lambda xs: (min(xs), max(xs)), lambda r: (_ints(r),)),
    F(("first_negative", "index_of_negative", "find_negative"), "numbers: List[int]", "int",
      ("Return the index of the first negative number, or -1 if there is none.",
       "Find the position of the first element below zero; -1 if all are non-negative."),
      lambda xs: next((i for i, x in enumerate(xs) if x < 0), -1), lambda r: (_ints(r, -3, 9),)),
    F(("chunks", "split_into_chunks", "batch"), "items: List[int], size: int", "List[List[int]]",
      ("Split the list into consecutive chunks of the given size (the last one may be shorter).",
       "Group the elements into lists of length size."),
      lambda xs, n: [xs[i : i + n] for i in range(0, len(xs), n)], lambda r: (_ints(r, 0, 9), r.randint(1, 3))),
    F(("toggle_case", "swap_case", "invert_case"), "word: str", "str",
      ("Turn small letters into capitals and capitals into small letters.",
       "Return the string with the case of every letter swapped."),
      lambda s: s.swapcase(), lambda r: (_text(r),)),
    F(("cumulative_sum", "running_total", "prefix_sums"), "numbers: List[int]", "List[int]",
      ("Return the running totals of the list.",
       "Element i of the result is the sum of numbers[0] to numbers[i]."),
      lambda xs: [sum(xs[: i + 1]) for i in range(len(xs))], lambda r: (_ints(r),)),
    F(("zero_sum_pair", "has_zero_pair", "two_sum_zero"), "values: List[int]", "bool",
      ("Is there a pair at two different indexes whose total is 0?",
       "Check whether any two different positions of the list hold numbers adding up to 0."),
      lambda xs: any(xs[i] + xs[j] == 0 for i in range(len(xs)) for j in range(i + 1, len(xs))),
      lambda r: (_ints(r, -5, 5),)),
    F(("bitwise_xor_text", "binary_xor", "xor_strings"), "a: str, b: str", "str",
      ("Both arguments are made of the characters 0 and 1 and have equal length; combine them with exclusive or.",
       "XOR two equal-length bit strings character by character."),
      lambda a, b: "".join("1" if x != y else "0" for x, y in zip(a, b)),
      lambda r: (lambda n: ("".join(r.choice("01") for _ in range(n)), "".join(r.choice("01") for _ in range(n))))(
          r.randint(2, 6))),
    F(("truncate", "shorten", "clip_text"), "text: str, n: int", "str",
      ("Return the first n characters of text.",
       "Cut the string down to at most n characters."),
      lambda s, n: s[:n], lambda r: (_text(r), r.randint(1, 6))),
    F(("power_list", "raise_to_power", "powers"), "numbers: List[int], p: int", "List[int]",
      ("Raise every element of the list to the power p.",
       "Return [x ** p for each x] for the given list."),
      lambda xs, p: [x**p for x in xs], lambda r: (_ints(r, 0, 5), r.randint(0, 3))),
    F(("digit_list", "get_digits", "split_digits"), "n: int", "List[int]",
      ("Return the list of decimal digits of the non-negative integer n, most significant first.",
       "Break a number into its digits."),
      lambda n: [int(d) for d in str(n)], lambda r: (r.randint(0, 99999),)),
    F(("all_unique", "has_unique_chars", "no_repeats"), "s: str", "bool",
      ("Return True if no character occurs twice in s.",
       "Check whether all the characters of the string are different."),
      lambda s: len(set(s)) == len(s), lambda r: (_text(r),)),
    F(("char_frequency", "letter_counts", "tally_chars"), "text: str", "Dict[str, int]",
      ("Return a dictionary mapping each character of text to the number of times it occurs.",
       "Count every character of the string; return the counts as a dict."),
      lambda s: {c: s.count(c) for c in dict.fromkeys(s)}, lambda r: (r.choice(["abca", "hello", "aab", "xyzzy"]),)),
    F(("all_under", "all_below", "under_limit"), "values: List[int], limit: int", "bool",
      ("True when every item of values is strictly less than limit.",
       "Check that every element of the list is smaller than t."),
      lambda xs, t: all(x < t for x in xs), lambda r: (_ints(r, 0, 20), r.randint(5, 25))),
    F(("distinct_char_count", "distinct_chars", "unique_letters"), "text: str", "int",
      ("Lower-case the text, then count how many different symbols it uses.",
       "Return the number of different characters of the string, ignoring case."),
      lambda s: len(set(s.lower())), lambda r: (_text(r),)),
)


def _fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def _call(name: str, args: tuple[Any, ...]) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def _prompt(r: R, fam: Family) -> str:
    name = r.choice(fam.names)
    doc = r.choice(fam.docs)
    examples = []
    for _ in range(r.randint(1, 3)):
        args = fam.gen(r)
        examples.append((_call(name, args), repr(fam.fn(*args))))
    style = r.randrange(3)
    if style == 0:  # doctest
        ex = "".join(f"    >>> {c}\n    {v}\n" for c, v in examples)
        body = f"    \"\"\" {doc}\n{ex}    \"\"\"\n"
    elif style == 1:  # "For example:" with ==
        ex = "".join(f"    {c} == {v}\n" for c, v in examples)
        body = f"    \"\"\"\n    {doc}\n\n    For example:\n{ex}    \"\"\"\n"
    else:  # "Examples:" with ==>
        ex = "".join(f"    {c} ==> {v}\n" for c, v in examples)
        body = f"    \"\"\"{doc}\n    Examples:\n{ex}    \"\"\"\n"
    sig = f"def {name}({fam.params}) -> {fam.returns}:\n"
    typing = sorted(t for t in ("Dict", "List", "Optional", "Tuple") if f"{t}[" in fam.params + fam.returns)
    header = f"from typing import {', '.join(typing)}\n\n\n" if typing else ""
    return header + sig + body


def task_prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct task prompts (fewer only if the families run out of variety), seeded."""
    r = random.Random(seed)
    seen: set[str] = set()
    out: list[str] = []
    for _ in range(50 * n):
        if len(out) >= n:
            break
        p = _prompt(r, FAMILIES[r.randrange(len(FAMILIES))])
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out
