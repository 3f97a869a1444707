"""Training prompts from text every Python installation has: the standard library's functions, as a
signature plus docstring in the shape of a code-completion prompt — and, for the ``wide`` set, the same from
the third-party libraries tandem itself installs (numpy, jinja2, matplotlib, pydantic, ...).

Deterministic for a given Python: modules are scanned in a fixed order, members sorted by name, anything
whose signature text depends on the process (``<object at 0x...>`` defaults) is skipped, and the final
order is a seeded shuffle. HumanEval is never read here: it is held out for evaluation.
"""

from __future__ import annotations

import importlib
import inspect
import random
import textwrap
import warnings

from tandem.spec_decode.train.tasks import task_prompts

# Pure-Python standard-library modules with documented functions and classes (no GUI, no network I/O
# at import time). Missing ones are skipped.
STDLIB_MODULES = (
    "abc argparse ast base64 bisect calendar cmd codecs colorsys configparser contextlib copy csv "
    "dataclasses datetime decimal difflib dis email.utils enum filecmp fnmatch fractions ftplib "
    "functools getopt gettext glob graphlib gzip hashlib heapq hmac html html.parser http.client "
    "http.cookies imaplib inspect ipaddress json json.decoder json.encoder keyword linecache locale "
    "logging mailbox mimetypes netrc numbers operator optparse os os.path pathlib pickle pickletools "
    "pkgutil platform plistlib poplib pprint pstats queue quopri random re reprlib sched secrets "
    "selectors shlex shutil smtplib socketserver statistics string stringprep struct subprocess "
    "sysconfig tarfile tempfile textwrap threading timeit tokenize tomllib trace traceback types "
    "typing urllib.parse urllib.request uuid warnings wave weakref xml.dom.minidom zipfile zoneinfo"
).split()


# Modules of tandem's runtime dependencies (pyproject.toml) and theirs: other authors, other domains
# (arrays, templates, plotting, HTTP, parsing, images). Missing ones are skipped, as above.
LIBRARY_MODULES = (
    "numpy numpy.lib.npyio numpy.polynomial.polynomial numpy.ma.core jinja2.filters jinja2.utils "
    "jinja2.environment jinja2.runtime tqdm.std tqdm.utils click.core click.termui click.types "
    "starlette.datastructures starlette.routing pydantic.fields pydantic.types h11._connection "
    "anyio.streams.memory httpx2 matplotlib.pyplot matplotlib.colors matplotlib.cbook matplotlib.figure "
    "matplotlib.ticker matplotlib.dates matplotlib.transforms markupsafe safetensors.torch "
    "prometheus_client.metrics prometheus_client.exposition xgrammar.compiler packaging.specifiers idna.core "
    "dateutil.rrule pyparsing.core fontTools.misc.arrayTools PIL.Image PIL.ImageOps"
).split()


def _format(name: str, sig: str, doc: str, self_arg: bool) -> str:
    if self_arg:
        sig = "(self" + (", " + sig[1:] if sig != "()" else ")")
    body = textwrap.indent(doc.strip(), "    ")
    return f"def {name}{sig}:\n    \"\"\" {body.lstrip()}\n    \"\"\"\n"


def _entries(module_name: str) -> list[tuple[str, str]]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = importlib.import_module(module_name)
    except Exception:  # noqa: BLE001 - a missing or broken optional module is just skipped
        return []
    out: list[tuple[str, str]] = []

    def add(name: str, obj: object, self_arg: bool) -> None:
        if name.startswith("_"):
            return
        doc = inspect.getdoc(obj)
        if not doc or not 40 <= len(doc) <= 1200:
            return
        try:
            sig = str(inspect.signature(obj))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return
        if " at 0x" in sig or len(sig) > 200:
            return
        if self_arg:
            sig = sig.replace("(self, ", "(", 1).replace("(self)", "()", 1)
        out.append((f"{module_name}.{name}", _format(name, sig, doc, self_arg)))

    for name, obj in sorted(vars(module).items()):
        if getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj) or inspect.isbuiltin(obj):
            add(name, obj, False)
        elif inspect.isclass(obj) and not name.startswith("_"):
            for mname, member in sorted(vars(obj).items()):
                if inspect.isfunction(member):
                    add(mname, member, True)
    return out


def stdlib_prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct completion prompts (fewer if the standard library has fewer), seeded order."""
    return _module_prompts(STDLIB_MODULES, n, seed)


def library_prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct completion prompts from :data:`LIBRARY_MODULES` (fewer if they have fewer), seeded
    order; deterministic for given versions of those libraries."""
    return _module_prompts(LIBRARY_MODULES, n, seed)


def _module_prompts(modules: tuple[str, ...] | list[str], n: int, seed: int) -> list[str]:
    seen: set[str] = set()
    prompts: list[str] = []
    for module_name in modules:
        for _, prompt in _entries(module_name):
            if prompt not in seen:
                seen.add(prompt)
                prompts.append(prompt)
    random.Random(seed).shuffle(prompts)
    return prompts[:n]


PROMPT_SETS = ("stdlib", "tasks", "mixed", "wide")
TASK_FRACTION = 0.65  # of a mixed set: the rest are standard-library prompts
LIBRARY_FRACTION = 0.2  # of a wide set: the rest is the mixed set of the remaining size


def training_prompts(kind: str, n: int, seed: int = 0) -> list[str]:
    """The training prompts of a set: ``stdlib`` (above), ``tasks`` (``tasks.py``: benchmark-shaped tasks
    written for training), ``mixed`` (both, ``TASK_FRACTION`` tasks, seeded order) or ``wide`` (the mixed set
    of ``n - m`` prompts plus ``m = LIBRARY_FRACTION * n`` library prompts, seeded order). The mixed part is
    taken first: some libraries add methods to standard-library classes as they load (transformers to
    ``logging.Logger``), which would change the standard-library prompts taken after them."""
    if kind == "wide":
        n_lib = round(n * LIBRARY_FRACTION)
        out = training_prompts("mixed", n - n_lib, seed) + library_prompts(n_lib, seed)
        random.Random(seed + 1).shuffle(out)
        return out
    if kind == "stdlib":
        return stdlib_prompts(n, seed)
    if kind == "tasks":
        return task_prompts(n, seed)
    if kind != "mixed":
        raise ValueError(f"prompts must be one of {PROMPT_SETS}, got {kind!r}")
    n_tasks = round(n * TASK_FRACTION)
    out = task_prompts(n_tasks, seed) + stdlib_prompts(n - n_tasks, seed)
    random.Random(seed).shuffle(out)
    return out
