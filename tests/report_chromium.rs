//! `tensortune report` rendered by a real browser: headless Chromium (Debian's `chromium`,
//! installed by `scripts/setup.sh`) loads the page offline and a script added to a copy of it
//! reports what the browser laid out: the summary table's rows, an SVG curve with a drawn line
//! per workload section, and the loop nests. A screenshot is written too, for a person to look
//! at (its path is printed).
//!
//! Without Chromium the test says so on stderr and returns; under CI (`CI` set), where
//! `scripts/setup.sh` must have installed it, a missing browser fails the test instead.
//! `TENSORTUNE_CHROMIUM=/path/to/chromium` picks another binary.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tensortune::records::{Database, ErrorKind, NewRecord, Timing, Workload};
use tensortune::schedules::ops::WorkloadSpec;
use tensortune::schedules::schedule::State;
use tensortune::{Target, TuneOptions};

/// The flags that keep Chromium from reaching out or needing a desktop.
const CHROMIUM_FLAGS: [&str; 7] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
];

/// Run by the browser on load: what it laid out, as JSON in `#render-check`.
const CHECK_SCRIPT: &str = r#"<script>
(function () {
  const size = (e) => { const r = e.getBoundingClientRect(); return [r.width, r.height]; };
  const sections = [...document.querySelectorAll("section.workload")].map((s) => ({
    title: s.querySelector("h2") ? s.querySelector("h2").textContent : "",
    svgs: [...s.querySelectorAll("svg")].map((svg) => ({
      size: size(svg),
      lines: [...svg.querySelectorAll("polyline")].filter((p) => size(p)[0] > 0).length,
      marks: [...svg.querySelectorAll("circle")].filter((c) => size(c)[0] > 0).length,
    })),
    nests: [...s.querySelectorAll("pre.loop-nest")].map((p) => p.textContent),
  }));
  const table = document.querySelector("table#summary");
  const rows = table ? [...table.querySelectorAll("tbody tr")].map(
    (r) => [...r.querySelectorAll("td")].map((d) => d.textContent)) : [];
  const out = document.createElement("pre");
  out.id = "render-check";
  out.textContent = JSON.stringify({
    tableSize: table ? size(table) : [0, 0], rows, sections });
  document.body.appendChild(out);
})();
</script>"#;

fn find_chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TENSORTUNE_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| ["chromium", "chromium-browser"].map(|n| dir.join(n)))
        .find(|p| p.is_file())
}

/// Runs Chromium on `page` with `args`, a fresh profile, and a time limit; returns stdout.
fn chromium(bin: &Path, profile: &Path, args: &[String], page: &Path) -> String {
    let mut child = Command::new(bin)
        .args(CHROMIUM_FLAGS)
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chromium starts");
    let mut stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut s).map(|_| s)
    });
    let mut stderr = child.stderr.take().expect("stderr");
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            panic!("chromium did not finish in 90 s: {args:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = reader.join().expect("reader").expect("stdout is text");
    let err = err_reader.join().expect("stderr reader");
    assert!(status.success(), "chromium {args:?}: {status}\n{err}");
    out
}

/// A database with a real tuning run of a small matmul, and two hand-made records (one a
/// failure) of a softmax, so the page has two workloads, runs and no-run records.
fn make_db(path: &Path) {
    let matmul = WorkloadSpec::parse("matmul:M=64,N=64,K=64").expect("spec");
    let opts = TuneOptions {
        trials: 16,
        batch_size: 8,
        population: 64,
        remeasure_top: 0,
        db: Some(path.to_path_buf()),
        quiet: true,
        ..TuneOptions::default()
    };
    tensortune::tune(&matmul, &Target::host(1), &opts).expect("tunes");

    let softmax = WorkloadSpec::parse("softmax:M=32,N=64").expect("spec");
    let dag = softmax.build().expect("dag");
    let w = Workload::new(softmax.canonical(), dag.flops());
    let trace = State::new(&dag).trace().to_json();
    let timing = Timing {
        median_s: 4e-6,
        min_s: 3.9e-6,
        max_s: 4.2e-6,
        repeats: 5,
    };
    let target = Target::host(1).key();
    let mut db = Database::open(path).expect("open");
    db.insert_batch(
        None,
        &[
            NewRecord::failed(
                w.clone(),
                &target,
                r#"{"steps":[],"x":1}"#,
                ErrorKind::Timeout,
                "t",
            ),
            NewRecord::measured(w, &target, trace, timing),
        ],
    )
    .expect("insert");
}

#[test]
fn the_report_renders_in_chromium_with_its_table_and_a_curve_per_workload() {
    let Some(browser) = find_chromium() else {
        let missing = "no chromium on PATH (Debian's `chromium`, installed by \
                       scripts/setup.sh; or set TENSORTUNE_CHROMIUM)";
        assert!(
            std::env::var_os("CI").is_none(),
            "report_chromium: {missing}, and CI must render the report"
        );
        // Straight to the process's stderr, past the test harness's capture, so it is seen.
        let _ = writeln!(
            std::io::stderr(),
            "report_chromium: SKIPPED, {missing}: the report was not rendered"
        );
        return;
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("report_chromium");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let db = dir.join("tuning.db");
    make_db(&db);

    let page = dir.join("report.html");
    let out = Command::new(env!("CARGO_BIN_EXE_tensortune"))
        .args(["report", "--db"])
        .arg(&db)
        .arg("--out")
        .arg(&page)
        .output()
        .expect("tensortune runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(&page).expect("report");

    // What the browser laid out, from a copy of the page with the check script.
    let checked = dir.join("checked.html");
    let with_script = html.replacen("</body>", &format!("{CHECK_SCRIPT}\n</body>"), 1);
    std::fs::write(&checked, with_script).expect("write");
    let dom = chromium(
        &browser,
        &dir.join("profile-dom"),
        &["--dump-dom".into()],
        &checked,
    );
    let start = dom
        .find("<pre id=\"render-check\">")
        .expect("the check script ran")
        + "<pre id=\"render-check\">".len();
    let end = start + dom[start..].find("</pre>").expect("end of the check");
    let json = dom[start..end]
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    let check: serde_json::Value = serde_json::from_str(&json).expect("check JSON");

    let rows = check["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2, "a row per workload and target: {rows:?}");
    let keys: Vec<&str> = rows.iter().map(|r| r[0].as_str().expect("key")).collect();
    assert!(
        keys.contains(&"matmul:K=64,M=64,N=64,dtype=f32"),
        "{keys:?}"
    );
    assert!(keys.contains(&"softmax:M=32,N=64,dtype=f32"), "{keys:?}");
    for r in rows {
        let cells = r.as_array().expect("cells");
        assert_eq!(cells.len(), 6, "{cells:?}");
        assert_ne!(
            cells[5].as_str(),
            Some("-"),
            "a best GFLOP/s in every row: {cells:?}"
        );
    }
    let softmax = rows
        .iter()
        .find(|r| r[0].as_str().is_some_and(|k| k.starts_with("softmax")))
        .expect("softmax row");
    assert_eq!(
        (softmax[2].as_str(), softmax[3].as_str()),
        (Some("2"), Some("1"))
    );
    assert!(
        check["tableSize"][0].as_f64().expect("width") > 100.0,
        "{check}"
    );

    let sections = check["sections"].as_array().expect("sections");
    assert_eq!(sections.len(), 2, "{check}");
    for s in sections {
        let svgs = s["svgs"].as_array().expect("svgs");
        assert_eq!(svgs.len(), 1, "one curve in {}", s["title"]);
        let svg = &svgs[0];
        assert!(svg["size"][0].as_f64().expect("w") >= 400.0, "{svg}");
        assert!(svg["size"][1].as_f64().expect("h") >= 200.0, "{svg}");
        // Every curve marks its improvements; the tuned matmul's also has a line to draw.
        assert!(svg["marks"].as_u64().expect("marks") >= 1, "a mark: {svg}");
        if s["title"].as_str().is_some_and(|t| t.starts_with("matmul")) {
            assert!(
                svg["lines"].as_u64().expect("lines") >= 1,
                "a drawn line: {svg}"
            );
        }
        let nests = s["nests"].as_array().expect("nests");
        assert_eq!(nests.len(), 1, "{}", s["title"]);
        assert!(
            nests[0].as_str().expect("text").contains("for "),
            "{}",
            nests[0]
        );
    }

    // A picture of the page as it is shipped (no check script), for a person to look at.
    let png = dir.join("report.png");
    chromium(
        &browser,
        &dir.join("profile-shot"),
        &[
            format!("--screenshot={}", png.display()),
            "--window-size=1200,2400".into(),
            "--hide-scrollbars".into(),
        ],
        &page,
    );
    let bytes = std::fs::read(&png).expect("screenshot written");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    let _ = writeln!(
        std::io::stderr(),
        "report_chromium: screenshot at {}",
        png.display()
    );
}
