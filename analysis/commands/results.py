"""`flashsim results`: the results data set (benchmarks/results/data/<kind>.jsonl):
list it, show rows, add rows, regenerate the results page's tables (docs/results.md)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EPILOG = """examples:
  flashsim results list                          # kinds, rows, runs, devices
  flashsim results show bench --device H100 --where impl=fa2 --where N=4096
  flashsim results add out/bench.json --kind bench --run-id 2026-12-01-a100-bench
  flashsim results add out/gpu_tests.xml --run-id gpu_tests-20261201T1200-a100 \
      --device "NVIDIA A100-SXM4-80GB" --commit abc1234 --command "pytest -m gpu"
  flashsim results tables                        # regenerate docs/results.md's tables
  flashsim results tables --check                # exit 1 if docs/results.md is out of date

A table goes where the page has <!-- results:NAME --> ... <!-- /results:NAME -->;
NAME is a key of analysis.tables.TABLES."""


def register(sub):
    p = sub.add_parser("results", help="the results data set: list, show, add rows, "
                                       "regenerate the results page's tables",
                       description=__doc__.replace("\n", " "), epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None, metavar="DIR",
                   help="data set folder (default: benchmarks/results/data, or $FLASHSIM_RESULTS)")
    s = p.add_subparsers(dest="action", metavar="ACTION")
    s.add_parser("list", help="kinds with their rows, runs and devices")
    sh = s.add_parser("show", help="print rows of one kind as JSON lines")
    sh.add_argument("kind")
    sh.add_argument("--device", default=None, help="keep rows whose device contains this")
    sh.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                    help="keep rows with row[KEY] == VALUE (VALUE parsed as JSON if it can be)")
    ad = s.add_parser("add", help="append rows from a JSON list or JSON-lines file, or "
                                  "gpu_tests rows from pytest's JUnit XML (FILE.xml) "
                                  "(rows already there are skipped)")
    ad.add_argument("file")
    ad.add_argument("--kind", default=None, help="kind for rows that lack one")
    ad.add_argument("--run-id", default=None, help="run_id for rows that lack one "
                                                   "(a row's own run_id is kept as source_run_id)")
    ad.add_argument("--commit", default=None, help="commit for rows that lack one")
    ad.add_argument("--device", default=None, help="device for rows that lack one (JUnit "
                                                   "XML names none)")
    ad.add_argument("--date", default=None, help="date for rows that lack one")
    ad.add_argument("--versions", default=None, metavar="JSON",
                    help='versions for rows that lack them, e.g. \'{"torch": "2.11.0"}\'')
    ad.add_argument("--command", dest="junit_command", default=None,
                    help="JUnit XML: the pytest command that ran")
    t = s.add_parser("tables", help="regenerate the marked tables in docs/results.md")
    t.add_argument("--page", "--readme", dest="page", default=None, metavar="FILE",
                   help="the Markdown page holding the markers (default: docs/results.md "
                        "of the repository)")
    t.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 if a table is out of date")
    p.set_defaults(func=main)


def _value(text):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(args) -> int:
    from iosim import ConfigError
    from analysis import results as R
    if args.action is None:
        raise ConfigError("give an action: list, show, add or tables (flashsim results --help)")
    if args.action == "list":
        R.existing_data_dir(args.data)
        ks = R.kinds(args.data)
        if not ks:
            print(f"{R.data_dir(args.data)}: no kinds (no <kind>.jsonl files)")
            return 0
        print(f"{R.data_dir(args.data)}:")
        for k in ks:
            rows = R.load(k, data=args.data)
            devs = sorted({r.get("device") for r in rows})
            print(f"  {k:<20} {len(rows):>5} rows, {len({r['run_id'] for r in rows}):>3} runs; "
                  f"{', '.join(map(str, devs))}")
        return 0
    if args.action == "show":
        where = {}
        for w in args.where:
            if "=" not in w:
                raise ConfigError(f"where={w!r} must be KEY=VALUE")
            k, v = w.split("=", 1)
            where[k] = _value(v)
        R.check_kind_known(args.kind, args.data)
        rows = R.load(args.kind, device=args.device, data=args.data, **where)
        for r in rows:
            print(json.dumps(r))
        if not rows:      # a filter that matches nothing is an answer, not an error
            print(f"flashsim results: no {args.kind} rows match", file=sys.stderr)
        return 0
    if args.action == "add":
        return _add(args, R)
    return _tables(args)


def _add(args, R) -> int:
    from iosim import ConfigError
    from analysis.paths import check_out_dir
    path = Path(args.file)
    if not path.is_file():
        raise ConfigError(f"file={args.file!r} "
                          f"{'is not a file' if path.exists() else 'does not exist'}")
    text = path.read_text()
    if path.suffix == ".xml":
        rows = R.junit_rows(text, command=args.junit_command)
    else:
        try:
            data = json.loads(text)
            rows = (data if isinstance(data, list) else
                    data.get("rows", [data]) if isinstance(data, dict) else [data])
        except json.JSONDecodeError:
            rows = []
            for n, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ConfigError(f"file={args.file!r}: line {n} is not JSON ({e.msg}); "
                                          f"allowed: a JSON list, a JSON object or JSON "
                                          f"lines, or JUnit XML (FILE.xml)") from None
        bad = [r for r in rows if not isinstance(r, dict)]
        if bad:
            raise ConfigError(f"file={args.file!r}: rows must be JSON objects; got "
                              f"{json.dumps(bad[0])[:60]}")
    try:
        versions = json.loads(args.versions) if args.versions else {}
    except json.JSONDecodeError as e:
        raise ConfigError(f"versions={args.versions!r} is not JSON: {e}") from None
    if not isinstance(versions, dict):
        raise ConfigError(f"versions={args.versions!r} must be a JSON object")
    made = []
    for r in rows:
        r = dict(r)
        for key in ("device", "date"):
            if getattr(args, key) is not None:
                r.setdefault(key, getattr(args, key))
        if args.run_id:
            if "run_id" in r and r["run_id"] != args.run_id:
                r["source_run_id"] = r["run_id"]
            r["run_id"] = args.run_id
        if args.kind and "kind" not in r:
            r["kind"] = args.kind
        r.setdefault("commit", args.commit)
        r.setdefault("versions", versions)
        made.append(r)
    for r in made:          # every row checked, then the folder: a bad row adds nothing
        R.validate(r)
    check_out_dir(R.data_dir(args.data), "--data")
    added, skipped = R.append(made, data=args.data)
    print(f"flashsim results: {added} rows added, {skipped} already there")
    return 0


def _tables(args) -> int:
    from analysis import results as R
    from analysis.tables import TARGET, render
    from analysis.paths import check_out_file
    readme = Path(args.page) if args.page else R.ROOT / TARGET
    R.existing_data_dir(args.data)
    if not readme.is_file():
        raise ValueError(f"--page {str(readme)!r} "
                         f"{'is not a file' if readme.exists() else 'does not exist'}")
    if not args.check:
        check_out_file(readme, "--page")
    old = readme.read_text()
    new, names = render(old, data=args.data)
    if not names:               # nothing to regenerate or check is an error, not a pass
        raise ValueError(f"--page {str(readme)!r} has no <!-- results:NAME --> markers; "
                         f"allowed: a page with at least one (docs/results.md)")
    if args.check:
        if new != old:
            print(f"{readme}: tables out of date ({', '.join(names)}); run "
                  f"`flashsim results tables`", file=sys.stderr)
            return 1
        print(f"{readme}: {len(names)} tables up to date")
        return 0
    if new != old:
        readme.write_text(new)
    print(f"{readme}: {len(names)} tables regenerated ({', '.join(names)})"
          + ("" if new != old else "; unchanged"))
    return 0
