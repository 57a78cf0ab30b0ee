"""Reference solutions of the code tasks (kairox_py/data/code_tasks.jsonl), by task id.

Only tests/test_code_tasks.py reads them: each one, run through the same harness as a
model's answer, must pass its task's tests, which proves every task solvable and its tests
consistent with its docstring. Each is a complete function definition, as a model replies.
"""
from __future__ import annotations

SOLUTIONS: dict[str, str] = {
    "count_vowels": '''
def count_vowels(text: str) -> int:
    return sum(1 for c in text.lower() if c in "aeiou")
''',
    "run_length_encode": '''
def run_length_encode(s: str) -> str:
    out = []
    i = 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        out.append(f"{s[i]}{j - i}")
        i = j
    return "".join(out)
''',
    "run_length_decode": '''
def run_length_decode(s: str) -> str:
    import re
    return "".join(ch * int(n) for ch, n in re.findall(r"(\\D)(\\d+)", s))
''',
    "palindrome_sentence": '''
def is_palindrome_sentence(text: str) -> bool:
    kept = [c.lower() for c in text if c.isalnum()]
    return kept == kept[::-1]
''',
    "snake_to_camel": '''
def snake_to_camel(name: str) -> str:
    words = [w for w in name.split("_") if w]
    if not words:
        return ""
    return words[0].lower() + "".join(w[:1].upper() + w[1:].lower() for w in words[1:])
''',
    "camel_to_snake": '''
def camel_to_snake(name: str) -> str:
    out = []
    for i, c in enumerate(name):
        if c.isupper() and i > 0:
            out.append("_")
        out.append(c.lower())
    return "".join(out)
''',
    "common_prefix": '''
def longest_common_prefix(words: list[str]) -> str:
    if not words:
        return ""
    prefix = words[0]
    for w in words[1:]:
        while not w.startswith(prefix):
            prefix = prefix[:-1]
    return prefix
''',
    "caesar_shift": '''
def caesar_shift(text: str, shift: int) -> str:
    out = []
    for c in text:
        if "a" <= c <= "z":
            out.append(chr((ord(c) - 97 + shift) % 26 + 97))
        elif "A" <= c <= "Z":
            out.append(chr((ord(c) - 65 + shift) % 26 + 65))
        else:
            out.append(c)
    return "".join(out)
''',
    "word_frequencies": '''
def word_frequencies(text: str) -> dict[str, int]:
    import re
    counts: dict[str, int] = {}
    for w in re.findall(r"[A-Za-z]+", text):
        counts[w.lower()] = counts.get(w.lower(), 0) + 1
    return counts
''',
    "wrap_text": '''
def wrap_text(text: str, width: int) -> list[str]:
    lines: list[str] = []
    line = ""
    for word in text.split():
        if line and len(line) + 1 + len(word) <= width:
            line += " " + word
        else:
            if line:
                lines.append(line)
            line = word
    if line:
        lines.append(line)
    return lines
''',
    "squeeze_spaces": '''
def squeeze_spaces(text: str) -> str:
    return " ".join(text.split())
''',
    "is_anagram": '''
def is_anagram(a: str, b: str) -> bool:
    def key(s: str) -> list[str]:
        return sorted(s.replace(" ", "").lower())
    return key(a) == key(b)
''',
    "first_unique_char": '''
def first_unique_index(s: str) -> int:
    from collections import Counter
    counts = Counter(s)
    for i, c in enumerate(s):
        if counts[c] == 1:
            return i
    return -1
''',
    "balanced_brackets": '''
def is_balanced(s: str) -> bool:
    pairs = {")": "(", "]": "[", "}": "{"}
    stack = []
    for c in s:
        if c in "([{":
            stack.append(c)
        elif c in pairs:
            if not stack or stack.pop() != pairs[c]:
                return False
    return not stack
''',
    "to_base": '''
def to_base(n: int, base: int) -> str:
    if not 2 <= base <= 36:
        raise ValueError("base must be in 2..36")
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    if n == 0:
        return "0"
    sign = "-" if n < 0 else ""
    n = abs(n)
    out = []
    while n:
        n, r = divmod(n, base)
        out.append(digits[r])
    return sign + "".join(reversed(out))
''',
    "mask_email": '''
def mask_email(email: str) -> str:
    local, domain = email.split("@", 1)
    if len(local) > 2:
        local = local[0] + "*" * (len(local) - 2) + local[-1]
    return local + "@" + domain
''',
    "chunk_list": '''
def chunk_list(items: list, size: int) -> list[list]:
    if size < 1:
        raise ValueError("size must be at least 1")
    return [items[i:i + size] for i in range(0, len(items), size)]
''',
    "flatten": '''
def flatten(nested: list) -> list:
    out = []
    for x in nested:
        if isinstance(x, list):
            out.extend(flatten(x))
        else:
            out.append(x)
    return out
''',
    "dedupe": '''
def dedupe(items: list) -> list:
    seen = []
    for x in items:
        if x not in seen:
            seen.append(x)
    return seen
''',
    "rotate_right": '''
def rotate_right(items: list, k: int) -> list:
    if not items:
        return []
    k %= len(items)
    return items[-k:] + items[:-k] if k else list(items)
''',
    "group_by_length": '''
def group_by_length(words: list[str]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for w in words:
        out.setdefault(len(w), []).append(w)
    return out
''',
    "invert_dict": '''
def invert_dict(d: dict[str, int]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for k in sorted(d):
        out.setdefault(d[k], []).append(k)
    return out
''',
    "merge_intervals": '''
def merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out
''',
    "top_k_frequent": '''
def top_k_frequent(items: list[str], k: int) -> list[str]:
    from collections import Counter
    counts = Counter(items)
    return sorted(counts, key=lambda s: (-counts[s], s))[:k]
''',
    "deep_merge": '''
def deep_merge(base: dict, override: dict) -> dict:
    import copy
    out = copy.deepcopy(base)
    for k, v in override.items():
        if isinstance(out.get(k), dict) and isinstance(v, dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out
''',
    "transpose": '''
def transpose(matrix: list[list[int]]) -> list[list[int]]:
    return [list(col) for col in zip(*matrix)]
''',
    "second_largest": '''
def second_largest(nums: list[int]) -> int | None:
    values = sorted(set(nums))
    return values[-2] if len(values) >= 2 else None
''',
    "running_max": '''
def running_max(nums: list[int]) -> list[int]:
    out = []
    for x in nums:
        out.append(x if not out else max(out[-1], x))
    return out
''',
    "spiral_order": '''
def spiral_order(matrix: list[list[int]]) -> list[int]:
    out = []
    rows = [list(r) for r in matrix]
    while rows:
        out.extend(rows.pop(0))
        rows = [list(r) for r in zip(*rows)][::-1]
    return out
''',
    "sliding_window_max": '''
def window_maxima(nums: list[int], k: int) -> list[int]:
    if k < 1 or k > len(nums):
        return []
    return [max(nums[i:i + k]) for i in range(len(nums) - k + 1)]
''',
    "digital_root": '''
def digital_root(n: int) -> int:
    while n >= 10:
        n = sum(int(d) for d in str(n))
    return n
''',
    "count_primes": '''
def count_primes_below(n: int) -> int:
    if n < 3:
        return 0
    sieve = [True] * n
    sieve[0] = sieve[1] = False
    for i in range(2, int(n ** 0.5) + 1):
        if sieve[i]:
            sieve[i * i::i] = [False] * len(range(i * i, n, i))
    return sum(sieve)
''',
    "gcd_of_list": '''
def gcd_of_list(nums: list[int]) -> int:
    from math import gcd
    g = 0
    for x in nums:
        g = gcd(g, x)
    return g
''',
    "collatz_steps": '''
def collatz_steps(n: int) -> int:
    if n < 1:
        raise ValueError("n must be positive")
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps
''',
    "fraction_to_decimal": '''
def fraction_to_decimal(numerator: int, denominator: int) -> str:
    sign = "-" if numerator * denominator < 0 else ""
    n, d = abs(numerator), abs(denominator)
    whole, rem = divmod(n, d)
    if rem == 0:
        return sign + str(whole)
    digits: list[str] = []
    seen: dict[int, int] = {}
    while rem and rem not in seen:
        seen[rem] = len(digits)
        q, rem = divmod(rem * 10, d)
        digits.append(str(q))
    if rem:
        i = seen[rem]
        frac = "".join(digits[:i]) + "(" + "".join(digits[i:]) + ")"
    else:
        frac = "".join(digits)
    return f"{sign}{whole}.{frac}"
''',
    "mean_median_mode": '''
def summary_stats(nums: list[int]) -> tuple[float, float, int]:
    from collections import Counter
    s = sorted(nums)
    n = len(s)
    mean = sum(s) / n
    median = float(s[n // 2]) if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
    counts = Counter(s)
    mode = min(counts, key=lambda v: (-counts[v], v))
    return mean, median, mode
''',
    "binomial": '''
def binomial(n: int, k: int) -> int:
    if k < 0 or k > n:
        return 0
    result = 1
    for i in range(1, min(k, n - k) + 1):
        result = result * (n - i + 1) // i
    return result
''',
    "min_max_scale": '''
def min_max_scale(values: list[float]) -> list[float]:
    if not values:
        return []
    lo, hi = min(values), max(values)
    if lo == hi:
        return [0.0] * len(values)
    return [(v - lo) / (hi - lo) for v in values]
''',
    "is_perfect_square": '''
def is_perfect_square(n: int) -> bool:
    from math import isqrt
    return n >= 0 and isqrt(n) ** 2 == n
''',
    "parse_key_values": '''
def parse_key_values(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for segment in text.split(";"):
        if not segment.strip():
            continue
        key, _, value = segment.partition("=")
        out[key.strip()] = value.strip()
    return out
''',
    "parse_duration": '''
def parse_duration(text: str) -> int:
    import re
    m = re.fullmatch(r"\\s*(?:(\\d+)h)?\\s*(?:(\\d+)m)?\\s*(?:(\\d+)s)?\\s*", text)
    if not m or not any(m.groups()):
        raise ValueError(f"not a duration: {text!r}")
    h, mi, s = (int(g) if g else 0 for g in m.groups())
    return h * 3600 + mi * 60 + s
''',
    "parse_csv_line": '''
def parse_csv_line(line: str) -> list[str]:
    fields: list[str] = []
    field = []
    in_quotes = False
    i = 0
    while i < len(line):
        c = line[i]
        if in_quotes:
            if c == '"':
                if i + 1 < len(line) and line[i + 1] == '"':
                    field.append('"')
                    i += 1
                else:
                    in_quotes = False
            else:
                field.append(c)
        elif c == '"':
            in_quotes = True
        elif c == ",":
            fields.append("".join(field))
            field = []
        else:
            field.append(c)
        i += 1
    fields.append("".join(field))
    return fields
''',
    "compare_versions": '''
def compare_versions(a: str, b: str) -> int:
    pa = [int(x) for x in a.split(".")]
    pb = [int(x) for x in b.split(".")]
    n = max(len(pa), len(pb))
    pa += [0] * (n - len(pa))
    pb += [0] * (n - len(pb))
    return (pa > pb) - (pa < pb)
''',
    "ipv4_to_int": '''
def ipv4_to_int(address: str) -> int:
    parts = address.split(".")
    if len(parts) != 4:
        raise ValueError(f"not an IPv4 address: {address!r}")
    value = 0
    for p in parts:
        if not p.isdigit() or int(p) > 255:
            raise ValueError(f"bad part {p!r} in {address!r}")
        value = value * 256 + int(p)
    return value
''',
    "extract_hashtags": '''
def extract_hashtags(text: str) -> list[str]:
    import re
    out: list[str] = []
    for tag in re.findall(r"#([A-Za-z0-9_]+)", text):
        if tag.lower() not in out:
            out.append(tag.lower())
    return out
''',
    "evaluate_rpn": '''
def evaluate_rpn(tokens: list[str]) -> int:
    stack: list[int] = []
    for t in tokens:
        if t in ("+", "-", "*", "/"):
            b, a = stack.pop(), stack.pop()
            if t == "+":
                stack.append(a + b)
            elif t == "-":
                stack.append(a - b)
            elif t == "*":
                stack.append(a * b)
            else:
                q = abs(a) // abs(b)
                stack.append(q if (a >= 0) == (b >= 0) else -q)
        else:
            stack.append(int(t))
    return stack[-1]
''',
    "human_bytes": '''
def human_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")
''',
    "days_between": '''
def days_between(first: str, second: str) -> int:
    from datetime import date
    return abs((date.fromisoformat(first) - date.fromisoformat(second)).days)
''',
    "leftmost_index": '''
def leftmost_index(sorted_items: list[int], target: int) -> int:
    lo, hi = 0, len(sorted_items)
    while lo < hi:
        mid = (lo + hi) // 2
        if sorted_items[mid] < target:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < len(sorted_items) and sorted_items[lo] == target else -1
''',
    "grid_paths": '''
def count_paths(rows: int, cols: int, blocked: set[tuple[int, int]]) -> int:
    ways = [[0] * cols for _ in range(rows)]
    for r in range(rows):
        for c in range(cols):
            if (r, c) in blocked:
                continue
            if r == 0 and c == 0:
                ways[r][c] = 1
            else:
                ways[r][c] = (ways[r - 1][c] if r else 0) + (ways[r][c - 1] if c else 0)
    return ways[rows - 1][cols - 1]
''',
    "longest_increasing_run": '''
def longest_increasing_run(nums: list[int]) -> int:
    best = run = 0
    for i, x in enumerate(nums):
        run = run + 1 if i and x > nums[i - 1] else 1
        best = max(best, run)
    return best
''',
    "min_coins": '''
def min_coins(amount: int, coins: list[int]) -> int:
    inf = float("inf")
    best = [0] + [inf] * amount
    for a in range(1, amount + 1):
        for c in coins:
            if c <= a and best[a - c] + 1 < best[a]:
                best[a] = best[a - c] + 1
    return -1 if best[amount] == inf else int(best[amount])
''',
    "topological_order": '''
def build_order(deps: dict[str, list[str]]) -> list[str]:
    import heapq
    nodes = set(deps)
    for ds in deps.values():
        nodes.update(ds)
    waiting = {n: set(deps.get(n, [])) for n in nodes}
    ready = [n for n in nodes if not waiting[n]]
    heapq.heapify(ready)
    order = []
    while ready:
        n = heapq.heappop(ready)
        order.append(n)
        for m in nodes:
            if n in waiting[m]:
                waiting[m].discard(n)
                if not waiting[m]:
                    heapq.heappush(ready, m)
    if len(order) != len(nodes):
        raise ValueError("dependency cycle")
    return order
''',
    "edit_distance": '''
def edit_distance(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]
''',
    "count_islands": '''
def count_islands(grid: list[str]) -> int:
    seen = set()
    count = 0
    for r, row in enumerate(grid):
        for c, cell in enumerate(row):
            if cell != "#" or (r, c) in seen:
                continue
            count += 1
            stack = [(r, c)]
            seen.add((r, c))
            while stack:
                y, x = stack.pop()
                for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                    if 0 <= ny < len(grid) and 0 <= nx < len(grid[ny]) and grid[ny][nx] == "#" \\
                            and (ny, nx) not in seen:
                        seen.add((ny, nx))
                        stack.append((ny, nx))
    return count
''',
    "format_table": '''
def format_table(rows: list[list[str]]) -> str:
    if not rows:
        return ""
    n = max(len(r) for r in rows)
    full = [r + [""] * (n - len(r)) for r in rows]
    widths = [max(len(r[i]) for r in full) for i in range(n)]
    return "\\n".join(" | ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in full)
''',
    "matrix_multiply": '''
def matmul(a: list[list[int]], b: list[list[int]]) -> list[list[int]]:
    if len(a[0]) != len(b):
        raise ValueError("shapes do not match")
    return [[sum(x * y for x, y in zip(row, col)) for col in zip(*b)] for row in a]
''',
    "lru_order": '''
def lru_evictions(capacity: int, requests: list[str]) -> list[str]:
    from collections import OrderedDict
    cache: OrderedDict[str, None] = OrderedDict()
    evicted = []
    for key in requests:
        if key in cache:
            cache.move_to_end(key)
            continue
        if len(cache) >= capacity:
            evicted.append(cache.popitem(last=False)[0])
        cache[key] = None
    return evicted
''',
    "ranges_summary": '''
def summarize_ranges(nums: list[int]) -> str:
    parts = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        parts.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(parts)
''',
    "bit_count": '''
def count_set_bits(n: int) -> int:
    return bin(n).count("1")
''',
}

#: plausible wrong answers, each failing its task's tests on an edge case the docstring names
WRONG: dict[str, str] = {
    "leftmost_index": '''
def leftmost_index(sorted_items: list[int], target: int) -> int:
    import bisect
    i = bisect.bisect_right(sorted_items, target) - 1
    return i if i >= 0 and sorted_items[i] == target else -1
''',
    "evaluate_rpn": '''
def evaluate_rpn(tokens: list[str]) -> int:
    stack = []
    for t in tokens:
        if t in "+-*/" and len(t) == 1:
            b, a = stack.pop(), stack.pop()
            stack.append({"+": a + b, "-": a - b, "*": a * b, "/": a // b}[t])
        else:
            stack.append(int(t))
    return stack[-1]
''',
    "merge_intervals": '''
def merge_intervals(intervals):
    out = []
    for start, end in sorted(intervals):
        if out and start < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out
''',
    "is_perfect_square": '''
def is_perfect_square(n: int) -> bool:
    return n >= 0 and int(n ** 0.5) ** 2 == n
''',
    "deep_merge": '''
def deep_merge(base: dict, override: dict) -> dict:
    for k, v in override.items():
        if isinstance(base.get(k), dict) and isinstance(v, dict):
            base[k] = deep_merge(base[k], v)
        else:
            base[k] = v
    return base
''',
}
