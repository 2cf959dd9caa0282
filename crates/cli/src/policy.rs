//! `nk policy show|set`: the tiering and placement policy, read and
//! changed at runtime in every metadata partition.

use nodekernel_client::Client;

#[derive(clap::Subcommand)]
pub enum PolicyCmd {
    /// Print every setting
    Show {
        /// Print JSON: the settings, each partition's, and whether they agree
        #[arg(long)]
        json: bool,
    },
    /// Change settings (KEY VALUE [KEY VALUE ...], all or none) and print
    /// the result. Keys: migration (on|off), high_watermark and
    /// low_watermark (percent), class.ID.high_watermark and
    /// class.ID.low_watermark, promotion (on|off), promote_after
    /// (accesses), half_life_ms, move_rate (bytes/s as a size: 64MiB;
    /// 0: no limit),
    /// placement (local-first|round-robin). A change lasts until the
    /// metadata server restarts: put it in the config file to keep it.
    Set {
        /// Settings to change, as KEY VALUE pairs (nk policy set
        /// high_watermark 80 move_rate 64MiB)
        #[arg(value_name = "KEY VALUE", num_args = 2.., required = true)]
        pairs: Vec<String>,
        /// Print the result as JSON
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(client: &Client, cmd: PolicyCmd) -> anyhow::Result<()> {
    let (set, json) = match cmd {
        PolicyCmd::Show { json } => (Vec::new(), json),
        PolicyCmd::Set { pairs, json } => {
            if pairs.len() % 2 != 0 {
                return Err(crate::common::invalid(format!(
                    "nk policy set takes KEY VALUE pairs; {:?} has no value",
                    pairs[pairs.len() - 1]
                )));
            }
            let set = pairs
                .chunks(2)
                .map(|p| (p[0].clone(), p[1].clone()))
                .collect();
            (set, json)
        }
    };
    let parts = client.policy(&set).await?;
    let same = parts.windows(2).all(|w| w[0] == w[1]);
    if json {
        let obj = |p: &Vec<(String, String)>| {
            serde_json::Value::Object(
                p.iter()
                    .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                    .collect(),
            )
        };
        let out = serde_json::json!({
            "settings": parts.first().map(obj),
            "partitions": parts.iter().map(obj).collect::<Vec<_>>(),
            "consistent": same,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let shown: Vec<&Vec<(String, String)>> = if same {
        parts.iter().take(1).collect()
    } else {
        parts.iter().collect()
    };
    for (i, p) in shown.iter().enumerate() {
        if !same {
            println!("metadata partition {i}:");
        }
        let width = p.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (k, v) in p.iter() {
            println!("{k:<width$}  {v}");
        }
    }
    if !same {
        eprintln!(
            "the partitions' settings differ (one restarted since a change?): set them again"
        );
    }
    Ok(())
}
