"""Remake docs/explore.png, the explorer page's screenshot in docs/explore.md and the README:

    python3 scripts/explore_screenshot.py

Writes the page of `flashsim explore --algorithm fa2 --seq-len 512 --head-dim 64
--block-rows 64 --block-cols 64 --causal --no-whatif`, opens it in headless Chromium
(apt-get install chromium chromium-driver; pip install selenium), steps it 30 times and
saves the window. Needs no GPU and no network.
"""
from __future__ import annotations

import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = ["explore", "--algorithm", "fa2", "--seq-len", "512", "--head-dim", "64",
        "--block-rows", "64", "--block-cols", "64", "--causal", "--no-whatif"]


def main(out=os.path.join(ROOT, "docs", "explore.png")) -> int:
    sys.path.insert(0, ROOT)
    from analysis.cli import main as flashsim
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    with tempfile.TemporaryDirectory() as tmp:
        page = os.path.join(tmp, "fa2.html")
        if flashsim(ARGS + ["--out", page]):
            return 1
        o = Options()
        for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=700,940",
                  "--hide-scrollbars"):
            o.add_argument(a)
        o.binary_location = "/usr/bin/chromium"
        d = webdriver.Chrome(options=o, service=Service("/usr/bin/chromedriver"))
        try:
            d.get("file://" + page)
            for _ in range(30):
                d.find_element("id", "btn-step").click()
            d.save_screenshot(out)
        finally:
            d.quit()
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
