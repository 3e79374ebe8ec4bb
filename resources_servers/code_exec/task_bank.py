"""The bundled code_exec tasks: small, deterministic Python functions (strings, lists, math), written for this
project (license: Apache-2.0). Each task is a function name, a description of what it must do, a reference
solution and the arguments of its tests; `prepare.py` computes the expected values by running the
reference solution and writes the JSONL rows.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class TaskSpec(NamedTuple):
    name: str  # the function's name (the row's entry_point)
    signature: str  # shown in the prompt
    description: str  # what it returns, completing "Write a Python function `<signature>` that ..."
    reference: str  # a correct solution
    tests: list[list[Any]]  # positional arguments of each test


TASKS: list[TaskSpec] = [
    TaskSpec(
        "add",
        "add(a, b)",
        "returns the sum of the integers a and b.",
        "def add(a, b):\n    return a + b\n",
        [[1, 2], [-5, 5], [0, 0], [123, 877], [-7, -8]],
    ),
    TaskSpec(
        "square",
        "square(n)",
        "returns n multiplied by itself.",
        "def square(n):\n    return n * n\n",
        [[0], [3], [-4], [12], [1]],
    ),
    TaskSpec(
        "is_even",
        "is_even(n)",
        "returns True if the integer n is even and False otherwise.",
        "def is_even(n):\n    return n % 2 == 0\n",
        [[0], [7], [10], [-3], [-8]],
    ),
    TaskSpec(
        "absolute",
        "absolute(n)",
        "returns the absolute value of the number n without using abs().",
        "def absolute(n):\n    return -n if n < 0 else n\n",
        [[5], [-5], [0], [-123], [2.5]],
    ),
    TaskSpec(
        "max_of_three",
        "max_of_three(a, b, c)",
        "returns the largest of the three numbers a, b and c.",
        "def max_of_three(a, b, c):\n    return max(a, b, c)\n",
        [[1, 2, 3], [3, 2, 1], [2, 3, 1], [-1, -2, -3], [5, 5, 4]],
    ),
    TaskSpec(
        "reverse_string",
        "reverse_string(s)",
        "returns the string s reversed.",
        "def reverse_string(s):\n    return s[::-1]\n",
        [["hello"], [""], ["a"], ["racecar"], ["abc def"]],
    ),
    TaskSpec(
        "count_vowels",
        "count_vowels(s)",
        "returns how many vowels (a, e, i, o, u, upper or lower case) the string s contains.",
        "def count_vowels(s):\n    return sum(c in 'aeiouAEIOU' for c in s)\n",
        [["hello"], ["AEIOU"], ["rhythm"], [""], ["Programming Language"]],
    ),
    TaskSpec(
        "is_palindrome",
        "is_palindrome(s)",
        "returns True if the string s reads the same forwards and backwards, ignoring case and non-alphanumeric"
        " characters.",
        "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]\n",
        [["racecar"], ["A man, a plan, a canal: Panama"], ["hello"], [""], ["No lemon, no melon"], ["ab"]],
    ),
    TaskSpec(
        "factorial",
        "factorial(n)",
        "returns n! (the product 1 * 2 * ... * n) for an integer n >= 0; factorial(0) is 1.",
        "def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result\n",
        [[0], [1], [5], [10], [20]],
    ),
    TaskSpec(
        "fibonacci",
        "fibonacci(n)",
        "returns the n-th Fibonacci number, with fibonacci(0) = 0 and fibonacci(1) = 1.",
        "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
        [[0], [1], [2], [10], [30], [50]],
    ),
    TaskSpec(
        "sum_list",
        "sum_list(numbers)",
        "returns the sum of the numbers in the list numbers (0 for an empty list).",
        "def sum_list(numbers):\n    return sum(numbers)\n",
        [[[1, 2, 3]], [[]], [[-1, 1]], [[10]], [[5, 5, 5, 5]]],
    ),
    TaskSpec(
        "list_max",
        "list_max(numbers)",
        "returns the largest number in the non-empty list numbers.",
        "def list_max(numbers):\n    return max(numbers)\n",
        [[[1, 5, 3]], [[-1, -5]], [[7]], [[2, 2, 2]], [[0, 100, 99]]],
    ),
    TaskSpec(
        "average",
        "average(numbers)",
        "returns the arithmetic mean of the non-empty list of numbers.",
        "def average(numbers):\n    return sum(numbers) / len(numbers)\n",
        [[[1, 2, 3]], [[4]], [[1, 2]], [[-3, 3, 6]], [[2.5, 3.5]]],
    ),
    TaskSpec(
        "count_occurrences",
        "count_occurrences(items, target)",
        "returns how many times target appears in the list items.",
        "def count_occurrences(items, target):\n    return items.count(target)\n",
        [[[1, 2, 1, 1], 1], [[], 3], [["a", "b"], "c"], [["x", "x"], "x"], [[0, 0, 1], 0]],
    ),
    TaskSpec(
        "remove_duplicates",
        "remove_duplicates(items)",
        "returns a new list with the duplicates of items removed, keeping the first occurrence of each value in order.",
        "def remove_duplicates(items):\n    seen = set()\n    out = []\n    for x in items:\n        if x not in"
        " seen:\n            seen.add(x)\n            out.append(x)\n    return out\n",
        [[[1, 2, 1, 3, 2]], [[]], [["a", "a", "a"]], [[3, 2, 1]], [[1, 1, 2, 2, 3, 3]]],
    ),
    TaskSpec(
        "flatten",
        "flatten(nested)",
        "returns a flat list of all the elements of nested, a list of lists (one level deep), in order.",
        "def flatten(nested):\n    return [x for sub in nested for x in sub]\n",
        [[[[1, 2], [3], [4, 5]]], [[]], [[[], [1]]], [[["a"], ["b", "c"]]], [[[0], [0], [0]]]],
    ),
    TaskSpec(
        "second_largest",
        "second_largest(numbers)",
        "returns the second largest distinct value in numbers, or None if there are fewer than two distinct values.",
        "def second_largest(numbers):\n    values = sorted(set(numbers))\n    return values[-2] if len(values) >= 2"
        " else None\n",
        [[[1, 2, 3]], [[5, 5, 4]], [[7]], [[2, 2]], [[-1, -2, -3, -1]], [[10, 9, 10, 8]]],
    ),
    TaskSpec(
        "is_prime",
        "is_prime(n)",
        "returns True if the integer n is a prime number and False otherwise.",
        "def is_prime(n):\n    if n < 2:\n        return False\n    i = 2\n    while i * i <= n:\n        if n % i =="
        " 0:\n            return False\n        i += 1\n    return True\n",
        [[2], [1], [0], [17], [21], [97], [-7], [7919]],
    ),
    TaskSpec(
        "gcd",
        "gcd(a, b)",
        "returns the greatest common divisor of the non-negative integers a and b (gcd(0, 0) is 0).",
        "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n",
        [[12, 18], [7, 13], [0, 5], [0, 0], [100, 75], [17, 17]],
    ),
    TaskSpec(
        "lcm",
        "lcm(a, b)",
        "returns the least common multiple of the positive integers a and b.",
        "def lcm(a, b):\n    x, y = a, b\n    while y:\n        x, y = y, x % y\n    return a * b // x\n",
        [[4, 6], [3, 5], [7, 7], [1, 9], [12, 18]],
    ),
    TaskSpec(
        "sum_of_digits",
        "sum_of_digits(n)",
        "returns the sum of the decimal digits of the integer n (ignore the sign).",
        "def sum_of_digits(n):\n    return sum(int(d) for d in str(abs(n)))\n",
        [[123], [0], [-45], [9999], [1000]],
    ),
    TaskSpec(
        "count_words",
        "count_words(s)",
        "returns the number of words in s, where words are separated by runs of whitespace.",
        "def count_words(s):\n    return len(s.split())\n",
        [["hello world"], [""], ["  many   spaces here "], ["one"], ["a\tb\nc"]],
    ),
    TaskSpec(
        "capitalize_words",
        "capitalize_words(s)",
        "returns s with the first letter of every space-separated word in upper case and the rest of each word"
        " unchanged.",
        "def capitalize_words(s):\n    return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))\n",
        [["hello world"], ["python is fun"], [""], ["a"], ["already Capital"]],
    ),
    TaskSpec(
        "is_anagram",
        "is_anagram(a, b)",
        "returns True if the strings a and b are anagrams of each other (same letters, ignoring case and spaces).",
        "def is_anagram(a, b):\n    norm = lambda s: sorted(s.replace(' ', '').lower())\n    return norm(a) =="
        " norm(b)\n",
        [["listen", "silent"], ["hello", "world"], ["Dormitory", "dirty room"], ["", ""], ["abc", "abcd"]],
    ),
    TaskSpec(
        "char_frequency",
        "char_frequency(s)",
        "returns a dict mapping each character of s to the number of times it appears.",
        "def char_frequency(s):\n    out = {}\n    for c in s:\n        out[c] = out.get(c, 0) + 1\n    return out\n",
        [["hello"], [""], ["aaa"], ["abcabc"], ["a b"]],
    ),
    TaskSpec(
        "caesar_cipher",
        "caesar_cipher(s, shift)",
        "returns s with each lower-case letter shifted forward in the alphabet by shift positions (wrapping from z to"
        " a); other characters stay unchanged.",
        "def caesar_cipher(s, shift):\n    return ''.join(chr((ord(c) - 97 + shift) % 26 + 97) if 'a' <= c <= 'z' else"
        " c for c in s)\n",
        [["abc", 1], ["xyz", 3], ["hello, world", 13], ["", 5], ["abc", 26]],
    ),
    TaskSpec(
        "fizzbuzz",
        "fizzbuzz(n)",
        "returns a list of strings for 1..n: 'Fizz' for multiples of 3, 'Buzz' for multiples of 5, 'FizzBuzz' for"
        " multiples of both, otherwise the number as a string.",
        "def fizzbuzz(n):\n    out = []\n    for i in range(1, n + 1):\n        s = ('Fizz' if i % 3 == 0 else '') +"
        " ('Buzz' if i % 5 == 0 else '')\n        out.append(s or str(i))\n    return out\n",
        [[1], [5], [15], [0], [3]],
    ),
    TaskSpec(
        "celsius_to_fahrenheit",
        "celsius_to_fahrenheit(c)",
        "converts the temperature c from degrees Celsius to degrees Fahrenheit (F = C * 9 / 5 + 32).",
        "def celsius_to_fahrenheit(c):\n    return c * 9 / 5 + 32\n",
        [[0], [100], [-40], [37], [25.5]],
    ),
    TaskSpec(
        "running_sum",
        "running_sum(numbers)",
        "returns the list of prefix sums of numbers: element i is the sum of numbers[0..i].",
        "def running_sum(numbers):\n    out, total = [], 0\n    for x in numbers:\n        total += x\n       "
        " out.append(total)\n    return out\n",
        [[[1, 2, 3, 4]], [[]], [[5]], [[1, -1, 1, -1]], [[0, 0, 7]]],
    ),
    TaskSpec(
        "chunk_list",
        "chunk_list(items, size)",
        "splits the list items into consecutive chunks of length size (the last chunk may be shorter) and returns the"
        " list of chunks.",
        "def chunk_list(items, size):\n    return [items[i:i + size] for i in range(0, len(items), size)]\n",
        [[[1, 2, 3, 4, 5], 2], [[], 3], [[1, 2, 3], 3], [[1, 2, 3], 1], [["a", "b", "c", "d"], 3]],
    ),
    TaskSpec(
        "rotate_list",
        "rotate_list(items, k)",
        "returns items rotated to the right by k positions (k >= 0, may exceed the length; an empty list stays empty).",
        "def rotate_list(items, k):\n    if not items:\n        return []\n    k %= len(items)\n    return items[-k:] +"
        " items[:-k] if k else list(items)\n",
        [[[1, 2, 3, 4, 5], 2], [[1, 2, 3], 0], [[1, 2, 3], 3], [[], 4], [[1, 2], 5]],
    ),
    TaskSpec(
        "merge_sorted",
        "merge_sorted(a, b)",
        "merges the two sorted lists a and b into one sorted list.",
        "def merge_sorted(a, b):\n    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n        if a[i] <="
        " b[j]:\n            out.append(a[i]); i += 1\n        else:\n            out.append(b[j]); j += 1\n    return"
        " out + a[i:] + b[j:]\n",
        [[[1, 3, 5], [2, 4, 6]], [[], [1, 2]], [[1, 1], [1]], [[], []], [[-2, 0], [-1, 3, 4]]],
    ),
    TaskSpec(
        "binary_search",
        "binary_search(items, target)",
        "returns the index of target in the sorted list items of distinct values, or -1 if it is absent.",
        "def binary_search(items, target):\n    lo, hi = 0, len(items) - 1\n    while lo <= hi:\n        mid = (lo +"
        " hi) // 2\n        if items[mid] == target:\n            return mid\n        if items[mid] < target:\n        "
        "    lo = mid + 1\n        else:\n            hi = mid - 1\n    return -1\n",
        [[[1, 3, 5, 7, 9], 7], [[1, 3, 5], 4], [[], 1], [[2], 2], [[1, 2, 3, 4, 5, 6], 1]],
    ),
    TaskSpec(
        "to_binary",
        "to_binary(n)",
        "returns the binary representation of the non-negative integer n as a string without a prefix (to_binary(0) is"
        " '0').",
        "def to_binary(n):\n    return bin(n)[2:]\n",
        [[0], [1], [5], [255], [1024]],
    ),
    TaskSpec(
        "from_binary",
        "from_binary(s)",
        "returns the integer value of the binary string s (made of 0s and 1s).",
        "def from_binary(s):\n    return int(s, 2)\n",
        [["0"], ["1"], ["101"], ["11111111"], ["10000000000"]],
    ),
    TaskSpec(
        "count_bits",
        "count_bits(n)",
        "returns the number of 1 bits in the binary representation of the non-negative integer n.",
        "def count_bits(n):\n    return bin(n).count('1')\n",
        [[0], [1], [7], [8], [255], [1023]],
    ),
    TaskSpec(
        "power_of_two",
        "power_of_two(n)",
        "returns True if the integer n is a power of two (1, 2, 4, 8, ...) and False otherwise.",
        "def power_of_two(n):\n    return n > 0 and n & (n - 1) == 0\n",
        [[1], [2], [3], [0], [64], [-8], [96]],
    ),
    TaskSpec(
        "digits_reversed",
        "digits_reversed(n)",
        "returns the non-negative integer n with its decimal digits in reverse order (leading zeros dropped).",
        "def digits_reversed(n):\n    return int(str(n)[::-1])\n",
        [[123], [0], [100], [9], [120034]],
    ),
    TaskSpec(
        "triangle_number",
        "triangle_number(n)",
        "returns the n-th triangle number 1 + 2 + ... + n (0 for n = 0).",
        "def triangle_number(n):\n    return n * (n + 1) // 2\n",
        [[0], [1], [4], [10], [100]],
    ),
    TaskSpec(
        "collatz_steps",
        "collatz_steps(n)",
        "returns how many steps the Collatz process takes to reach 1 from the positive integer n (halve even numbers,"
        " map odd n to 3n + 1).",
        "def collatz_steps(n):\n    steps = 0\n    while n != 1:\n        n = n // 2 if n % 2 == 0 else 3 * n + 1\n    "
        "    steps += 1\n    return steps\n",
        [[1], [2], [6], [7], [27]],
    ),
    TaskSpec(
        "primes_up_to",
        "primes_up_to(n)",
        "returns the sorted list of all prime numbers less than or equal to n.",
        "def primes_up_to(n):\n    return [p for p in range(2, n + 1) if all(p % d for d in range(2, int(p ** 0.5) +"
        " 1))]\n",
        [[1], [2], [10], [30], [0]],
    ),
    TaskSpec(
        "matrix_transpose",
        "matrix_transpose(matrix)",
        "returns the transpose of the rectangular matrix given as a non-empty list of equal-length rows.",
        "def matrix_transpose(matrix):\n    return [list(row) for row in zip(*matrix)]\n",
        [[[[1, 2], [3, 4]]], [[[1, 2, 3]]], [[[1], [2], [3]]], [[[5]]], [[[1, 2, 3], [4, 5, 6]]]],
    ),
    TaskSpec(
        "dot_product",
        "dot_product(a, b)",
        "returns the dot product of the equal-length lists of numbers a and b.",
        "def dot_product(a, b):\n    return sum(x * y for x, y in zip(a, b))\n",
        [[[1, 2, 3], [4, 5, 6]], [[], []], [[1], [-1]], [[0, 0], [5, 7]], [[2, 3], [2, 3]]],
    ),
    TaskSpec(
        "longest_word",
        "longest_word(s)",
        "returns the longest space-separated word in the non-empty string s (the first one if several are equally"
        " long).",
        "def longest_word(s):\n    best = ''\n    for w in s.split():\n        if len(w) > len(best):\n            best"
        " = w\n    return best\n",
        [["the quick brown fox"], ["a bb cc"], ["single"], ["hi there you"], ["one three five"]],
    ),
    TaskSpec(
        "remove_spaces",
        "remove_spaces(s)",
        "returns s with every space character removed.",
        "def remove_spaces(s):\n    return s.replace(' ', '')\n",
        [["a b c"], [""], ["   "], ["nospace"], [" lead and trail "]],
    ),
    TaskSpec(
        "starts_with_vowel",
        "starts_with_vowel(s)",
        "returns True if the string s starts with a vowel (a, e, i, o, u, either case) and False otherwise (also for an"
        " empty string).",
        "def starts_with_vowel(s):\n    return bool(s) and s[0].lower() in 'aeiou'\n",
        [["apple"], ["banana"], [""], ["Orange"], ["yellow"]],
    ),
    TaskSpec(
        "run_length_encode",
        "run_length_encode(s)",
        "returns the run-length encoding of s: each run of a repeated character becomes the character followed by the"
        " run length, e.g. 'aaabcc' -> 'a3b1c2'.",
        "def run_length_encode(s):\n    out = []\n    i = 0\n    while i < len(s):\n        j = i\n        while j <"
        " len(s) and s[j] == s[i]:\n            j += 1\n        out.append(s[i] + str(j - i))\n        i = j\n   "
        " return ''.join(out)\n",
        [["aaabcc"], [""], ["a"], ["abc"], ["zzzzzzzzzzzz"]],
    ),
    TaskSpec(
        "balanced_parentheses",
        "balanced_parentheses(s)",
        "returns True if the brackets ()[]{} in s are balanced and properly nested, ignoring other characters.",
        "def balanced_parentheses(s):\n    pairs = {')': '(', ']': '[', '}': '{'}\n    stack = []\n    for c in s:\n   "
        "     if c in '([{':\n            stack.append(c)\n        elif c in pairs:\n            if not stack or"
        " stack.pop() != pairs[c]:\n                return False\n    return not stack\n",
        [["()"], ["([]{})"], ["(]"], ["(("], [""], ["a(b)c[d]"], ["}{"]],
    ),
    TaskSpec(
        "count_uppercase",
        "count_uppercase(s)",
        "returns the number of upper-case letters in the string s.",
        "def count_uppercase(s):\n    return sum(c.isupper() for c in s)\n",
        [["Hello World"], [""], ["ABC"], ["abc"], ["PyThOn"]],
    ),
    TaskSpec(
        "pig_latin",
        "pig_latin(word)",
        "translates the lower-case word into Pig Latin: if it starts with a vowel append 'way'; otherwise move the"
        " leading consonants to the end and append 'ay'.",
        "def pig_latin(word):\n    vowels = 'aeiou'\n    if word[0] in vowels:\n        return word + 'way'\n    i ="
        " 0\n    while i < len(word) and word[i] not in vowels:\n        i += 1\n    return word[i:] + word[:i] +"
        " 'ay'\n",
        [["apple"], ["hello"], ["string"], ["eat"], ["rhythm"]],
    ),
    TaskSpec(
        "sort_by_length",
        "sort_by_length(words)",
        "returns the list of strings words sorted by length, shortest first; words of equal length keep their original"
        " order.",
        "def sort_by_length(words):\n    return sorted(words, key=len)\n",
        [[["ccc", "a", "bb"]], [[]], [["aa", "b", "cc", "d"]], [["same", "four"]], [["longest", "", "mid"]]],
    ),
    TaskSpec(
        "common_elements",
        "common_elements(a, b)",
        "returns the sorted list of distinct values that appear in both lists a and b.",
        "def common_elements(a, b):\n    return sorted(set(a) & set(b))\n",
        [[[1, 2, 3], [2, 3, 4]], [[], [1]], [[1, 1, 2], [1, 1]], [[5, 6], [7, 8]], [[3, 1, 2], [2, 1, 3]]],
    ),
    TaskSpec(
        "two_sum",
        "two_sum(numbers, target)",
        "returns the indices [i, j] (i < j) of the first pair of numbers, in order of i then j, whose sum is target, or"
        " None if there is none.",
        "def two_sum(numbers, target):\n    for i in range(len(numbers)):\n        for j in range(i + 1,"
        " len(numbers)):\n            if numbers[i] + numbers[j] == target:\n                return [i, j]\n    return"
        " None\n",
        [[[2, 7, 11, 15], 9], [[3, 2, 4], 6], [[1, 2], 5], [[], 0], [[1, 1, 1], 2]],
    ),
    TaskSpec(
        "mode",
        "mode(numbers)",
        "returns the most frequent value in the non-empty list numbers; on a tie, the smallest of the most frequent"
        " values.",
        "def mode(numbers):\n    counts = {}\n    for x in numbers:\n        counts[x] = counts.get(x, 0) + 1\n    best"
        " = max(counts.values())\n    return min(x for x, c in counts.items() if c == best)\n",
        [[[1, 2, 2, 3]], [[4]], [[1, 1, 2, 2]], [[5, 3, 5, 3, 1]], [[-1, -1, 0]]],
    ),
    TaskSpec(
        "median",
        "median(numbers)",
        "returns the median of the non-empty list numbers (the mean of the two middle values for an even length).",
        "def median(numbers):\n    s = sorted(numbers)\n    n = len(s)\n    return s[n // 2] if n % 2 else (s[n // 2 -"
        " 1] + s[n // 2]) / 2\n",
        [[[3, 1, 2]], [[4, 1, 3, 2]], [[7]], [[1, 2]], [[5, 5, 5, 1]]],
    ),
    TaskSpec(
        "word_lengths",
        "word_lengths(s)",
        "returns the list of the lengths of the space-separated words of s, in order.",
        "def word_lengths(s):\n    return [len(w) for w in s.split()]\n",
        [["hello world"], [""], ["a bb ccc"], ["one"], ["  x  yy "]],
    ),
    TaskSpec(
        "clamp",
        "clamp(x, low, high)",
        "returns x limited to the range [low, high]: low if x < low, high if x > high, else x.",
        "def clamp(x, low, high):\n    return max(low, min(x, high))\n",
        [[5, 0, 10], [-5, 0, 10], [15, 0, 10], [0, 0, 0], [3.5, 1, 3]],
    ),
    TaskSpec(
        "hamming_distance",
        "hamming_distance(a, b)",
        "returns the number of positions at which the equal-length strings a and b differ.",
        "def hamming_distance(a, b):\n    return sum(x != y for x, y in zip(a, b))\n",
        [["karolin", "kathrin"], ["", ""], ["abc", "abc"], ["1011101", "1001001"], ["aaaa", "bbbb"]],
    ),
]
