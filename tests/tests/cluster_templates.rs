//! The cluster launch templates of `configs/cluster/`, run as they are on
//! this machine: the Slurm batch script through stand-in `sbatch` and
//! `srun` commands that start its steps as local processes, and the
//! commands of the Kubernetes manifest's two Jobs with their mounts and the
//! Service mapped to local paths and a loopback address. Each completes a
//! whole `coordinator run` with `[eval]`, its workers started once.

use fixtures::proc::{until, Proc};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use synth::Preset;

/// Generous bound on anything a test waits for (a loaded 2-core machine).
const DEADLINE: Duration = Duration::from_secs(400);

/// The templates' directory.
fn templates() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/cluster")
}

/// A run config body over short documents (64-token chunks) with the tiny
/// model at `model`, evaluating one candidate on the held-out split, and
/// `cluster` as its `[cluster]` section.
fn run_config(dir: &Path, model: &Path, cluster: &str) -> String {
    let docs: Vec<String> = (0..120)
        .map(|i| {
            format!(
                "Document {i} says that {} and {} differ by {}.",
                i * 7,
                i * 3,
                i * 4
            )
        })
        .collect();
    let docs_file = dir.join("docs.txt");
    std::fs::write(&docs_file, docs.join("\n\n")).unwrap();
    format!(
        "[model]\npath = {model:?}\n[corpus]\nn_ctx = 64\nheldout_fraction = 0.2\n\
         [[corpus.domains]]\nname = \"text\"\n\
         sources = [{{ path = {docs_file:?}, separator = \"\\n\\n\" }}]\n\
         [run]\nlease_chunks = 4\n\
         [eval]\nmethods = [\"frequency\"]\nk = [\"50%\"]\nsplit = \"heldout\"\n\
         [cluster]\n{cluster}"
    )
}

/// Writes an executable shell script.
fn script(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Stand-ins for Slurm: `sbatch` runs the batch script here with the job's
/// variables (and those of `--export`), `srun` starts `$STANDIN_TASKS`
/// tasks of its command as local processes and waits for them.
fn slurm_standins(bin: &Path) {
    script(
        &bin.join("sbatch"),
        "#!/bin/sh\n\
         export SLURM_JOB_ID=4242 SLURM_CPUS_PER_TASK=1 SLURM_SUBMIT_DIR=\"$PWD\"\n\
         while [ $# -gt 1 ]; do\n\
           case $1 in --export=*)\n\
             old=$IFS; IFS=,; for kv in ${1#--export=}; do case $kv in *=*) export \"$kv\";; esac; done; IFS=$old;;\n\
           esac\n\
           shift\n\
         done\n\
         exec bash \"$1\"\n",
    );
    script(
        &bin.join("srun"),
        "#!/bin/sh\n\
         while [ $# -gt 0 ]; do case $1 in --*) shift;; *) break;; esac; done\n\
         i=0; pids=\n\
         while [ $i -lt \"${STANDIN_TASKS:-2}\" ]; do\n\
           SLURM_LOCALID=$i SLURM_PROCID=$i \"$@\" & pids=\"$pids $!\"; i=$((i + 1))\n\
         done\n\
         status=0; for p in $pids; do wait $p || status=$?; done; exit $status\n",
    );
}

#[test]
fn the_slurm_template_runs_a_whole_run_with_eval_through_srun() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let model = fixtures::model(dir, Preset::Tiny);
    let secret = dir.join("join.secret");
    std::fs::write(&secret, protocol::secret::JoinSecret::generate().expose()).unwrap();
    let config = dir.join("run.toml");
    let cluster = format!("secret_file = {:?}\n", secret.display().to_string());
    std::fs::write(&config, run_config(dir, &model, &cluster)).unwrap();
    let bin = dir.join("bin");
    std::fs::create_dir(&bin).unwrap();
    slurm_standins(&bin);
    let run = dir.join("run");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let mut cmd = std::process::Command::new(bin.join("sbatch"));
    cmd.arg(format!(
        "--export=ALL,CONFIG={},RUN={}",
        config.display(),
        run.display()
    ))
    .arg(templates().join("slurm-run.sbatch"))
    .current_dir(dir)
    .env("PATH", path)
    .env("TMPDIR", dir)
    .env("COORDINATOR_BIN", fixtures::bin("coordinator"))
    .env("WORKER_BIN", fixtures::bin("worker"))
    .env("MOE_CENSUS_SECRET_FILE", &secret)
    .env("MOE_CENSUS_MODEL", &model)
    // A free port on loopback; a CPU machine.
    .env("MOE_CENSUS_PORT", "0")
    .env("MOE_CENSUS_HOST", "127.0.0.1")
    .env("MOE_CENSUS_PLACEMENT", "--n-gpu-layers 0")
    .env("STANDIN_TASKS", "2");
    let mut job = Proc::spawn(cmd);
    let status = job.wait(DEADLINE);
    let (out, log) = (job.out(), job.log());
    assert!(status.success(), "{out}\n{log}");
    assert!(
        out.contains("evaluated 1 candidates") && out.contains("run complete"),
        "{out}"
    );
    assert!(run.join("eval/summary.json").is_file());
    // Both srun tasks, started once, served both phases.
    assert_eq!(
        (
            job.logged("joined a collection").len(),
            job.logged("joined an evaluation").len()
        ),
        (2, 2),
        "{log}"
    );
}

/// The `command` and `args` of the container called `name` in the
/// manifest `yaml` (flow-style `command`, block-list `args`, as the
/// template writes them).
fn container_command(yaml: &str, name: &str) -> Vec<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim() == format!("- name: {name}"))
        .unwrap_or_else(|| panic!("no container {name}"));
    let mut argv = Vec::new();
    let mut in_args = None;
    for line in &lines[at + 1..] {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if let Some(list) = trimmed.strip_prefix("command: ") {
            let list = list.trim_matches(|c| c == '[' || c == ']');
            argv.extend(
                list.split(',')
                    .map(|s| s.trim().trim_matches('"').to_string()),
            );
        } else if trimmed == "args:" {
            in_args = Some(indent);
        } else if let Some(args_indent) = in_args {
            match trimmed.strip_prefix("- ") {
                Some(arg) if indent >= args_indent && !arg.starts_with('#') => {
                    argv.push(arg.trim().to_string())
                }
                _ if trimmed.starts_with('#') => {}
                _ => break,
            }
        }
    }
    assert!(argv.len() > 2, "{name}: {argv:?}");
    argv
}

/// `argv` with the pods' mounts under `root`, the run location at `run`
/// and the Service at `addr`.
fn mapped(argv: &[String], root: &Path, run: &Path, addr: &str, pod: &str) -> Vec<String> {
    let root = root.display().to_string();
    argv.iter()
        .map(|a| {
            a.replace("/etc/moe-census/", &format!("{root}/etc/moe-census/"))
                .replace("/models/", &format!("{root}/models/"))
                .replace("s3://bucket/runs/my-run", &run.display().to_string())
                .replace("moe-census-coordinator:7443", addr)
                .replace("$(POD_NAME)", pod)
        })
        .collect()
}

/// Runs `argv` (its first element a workspace binary's name).
fn start(argv: &[String]) -> Proc {
    let mut cmd = fixtures::command(&argv[0]);
    cmd.args(&argv[1..]);
    Proc::spawn(cmd)
}

#[test]
fn the_kubernetes_manifest_runs_a_whole_run_with_eval() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    let yaml = std::fs::read_to_string(templates().join("k8s-run.yaml")).unwrap();
    let coordinator = container_command(&yaml, "coordinator");
    let worker = container_command(&yaml, "worker");
    assert_eq!(
        (&coordinator[..2], &worker[..2]),
        (
            &["coordinator".to_string(), "run".into()][..],
            &["worker".to_string(), "join".into()][..]
        )
    );

    // What the pods mount: the CA (the coordinator's with its key), the
    // join secret, the model and the run config.
    let etc = root.join("etc/moe-census");
    let ca = etc.join("ca");
    fixtures::run_ok("coordinator", &["ca", ca.to_str().unwrap()]);
    std::fs::create_dir_all(etc.join("join")).unwrap();
    std::fs::write(
        etc.join("join/secret"),
        protocol::secret::JoinSecret::generate().expose(),
    )
    .unwrap();
    std::fs::create_dir_all(root.join("models")).unwrap();
    let tiny = fixtures::model(&root.join("models"), Preset::Tiny);
    std::fs::rename(tiny, root.join("models/model.gguf")).unwrap();
    std::fs::create_dir_all(etc.join("config")).unwrap();
    let connect = root.join("connect.json");
    let cluster = format!(
        "listen = \"127.0.0.1:0\"\nserver_names = [\"moe-census-coordinator\"]\n\
         ca_dir = {:?}\nsecret_file = {:?}\nconnect_file = {:?}\n",
        ca.display().to_string(),
        etc.join("join/secret").display().to_string(),
        connect.display().to_string()
    );
    std::fs::write(
        etc.join("config/run.toml"),
        run_config(root, &root.join("models/model.gguf"), &cluster),
    )
    .unwrap();

    let run = root.join("run");
    let mut coord = start(&mapped(&coordinator, root, &run, "", ""));
    let mut addr = String::new();
    until("the coordinator listens", DEADLINE, || {
        let info: Option<serde_json::Value> = std::fs::read(&connect)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        if let Some(a) = info.as_ref().and_then(|i| i["addr"].as_str()) {
            addr = a.to_string();
        }
        !addr.is_empty() || coord.child.try_wait().unwrap().is_some()
    });
    let mut pods: Vec<Proc> = (0..2)
        .map(|i| {
            let mut argv = mapped(
                &worker,
                root,
                &run,
                &addr,
                &format!("moe-census-workers-{i}"),
            );
            argv.extend(["--threads".into(), "1".into()]);
            start(&argv)
        })
        .collect();
    let status = coord.wait(DEADLINE);
    let out = coord.out();
    assert!(status.success(), "{out}\n{}", coord.log());
    assert!(
        out.contains("evaluated 1 candidates") && out.contains("run complete"),
        "{out}"
    );
    for pod in pods.iter_mut() {
        assert!(pod.wait(DEADLINE).success(), "{}", pod.log());
        let log = pod.log();
        assert!(
            log.contains("joined a collection") && log.contains("joined an evaluation"),
            "{log}"
        );
    }
}
