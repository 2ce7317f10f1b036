//! `coordinator ca` and `coordinator worker-key`: the cluster's credentials,
//! written once by hand before a run.

use clap::Args;
use config::run::ClusterSettings;
use runfiles::layout::env::JOIN_SECRET as SECRET_ENV;
use runtime::net::tls::{create_ca, write_private, CA_KEY_FILE};
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `coordinator ca`.
#[derive(Args, Debug)]
pub struct CaArgs {
    /// Directory that receives `ca.pem` (give it to workers) and `ca.key` (keep it secret).
    pub dir: PathBuf,
}

/// Arguments of `coordinator worker-key`.
#[derive(Args, Debug)]
pub struct WorkerKeyArgs {
    /// File holding the run's join secret (default: the MOE_CENSUS_JOIN_SECRET variable).
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// The worker's name: the only one the key proves.
    #[arg(long)]
    pub name: String,
    /// The key file to write (never replaced); give it to that worker only.
    #[arg(long)]
    pub out: PathBuf,
}

/// Entry point of `coordinator ca`.
pub fn ca(args: CaArgs) -> anyhow::Result<ExitCode> {
    let cert = create_ca(&args.dir)?;
    println!(
        "cluster CA written: {} (give it to workers: `worker join --ca {}`) and {} (keep it secret; set [cluster] ca_dir = {:?})",
        cert.display(),
        cert.display(),
        args.dir.join(CA_KEY_FILE).display(),
        args.dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Entry point of `coordinator worker-key`: writes the key of one worker
/// name (mode 0600, create-only), so that worker joins without the join
/// secret and cannot pose as any other.
pub fn worker_key(args: WorkerKeyArgs) -> anyhow::Result<ExitCode> {
    if args.name.is_empty() {
        anyhow::bail!("--name is empty: a worker key proves one name");
    }
    let cluster = ClusterSettings {
        secret_file: args.secret_file.clone(),
        ..ClusterSettings::default()
    };
    let (secret, shared) = runtime::run::secret(&cluster)?;
    if !shared {
        anyhow::bail!("no join secret: give --secret-file or set {SECRET_ENV}");
    }
    let key = protocol::secret::WorkerKey::derive(&secret, &args.name);
    write_private(&args.out, key.file_text().as_bytes())
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.out.display()))?;
    println!(
        "worker key of {:?} written: {} (give it to that worker only: `worker join --key-file {}`)",
        args.name,
        args.out.display(),
        args.out.display()
    );
    Ok(ExitCode::SUCCESS)
}
