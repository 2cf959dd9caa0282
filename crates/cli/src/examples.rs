//! The examples at the end of each command's `--help` (and so of
//! `docs/cli.md`).

pub const LS: &str = "\
Examples:
  nk ls /jobs                  names in /jobs
  nk ls -lh /jobs              with type, permissions, size, time
  nk ls -R /jobs               everything below /jobs
  nk ls '/logs/*.gz' --json    wildcards (quoted), as JSON";

pub const MKDIR: &str = "\
Examples:
  nk mkdir -p /jobs/job1/out
  nk mkdir --type table /cache
  nk mkdir --type bag /shuffle/0 /shuffle/1";

pub const PUT: &str = "\
Examples:
  nk put data.csv /jobs/in.csv        one file
  nk put a.csv b.csv /jobs/           into an existing container
  nk put -r ./dataset /jobs/          a directory with everything in it
  nk put -f data.csv /jobs/in.csv     replace an existing File
  tar c . | nk put - /backup.tar      from stdin";

pub const GET: &str = "\
Examples:
  nk get /jobs/in.csv .               into the current directory
  nk get /jobs/in.csv copy.csv        to a file (-f to replace one)
  nk get -r /jobs/out ./out           a whole container
  nk get '/jobs/part-*' ./parts/      wildcards (quoted)
  nk get /cache/k - | wc -c           to stdout";

pub const CP: &str = "\
Examples:
  nk cp /jobs/in.csv /archive/        inside the cluster
  nk cp -r /jobs/out /archive/out1    a whole container
  nk cp file:data.csv /jobs/          from a local file
  nk cp -r /jobs/out file:./out       to a local directory";

pub const CAT: &str = "\
Examples:
  nk cat /jobs/in.csv | head
  nk cat /shuffle/0                   a Bag's Files as one stream";

pub const HEAD: &str = "\
Examples:
  nk head /logs/app.log               the first 10 lines
  nk head -n 3 /logs/app.log
  nk head -c 1KiB /data.bin | xxd";

pub const TAIL: &str = "\
Examples:
  nk tail /logs/app.log               the last 10 lines
  nk tail -c 100 /data.bin";

pub const RM: &str = "\
Examples:
  nk rm /jobs/in.csv
  nk rm -r /jobs/job1
  nk rm -f '/tmp/*.part'              no error if nothing matches";

pub const MV: &str = "\
Examples:
  nk mv /jobs/out /jobs/out.done      rename
  nk mv /jobs/a.csv /jobs/b.csv /archive/
  nk mv -f /jobs/new.csv /jobs/in.csv replace atomically";

pub const TOUCH: &str = "\
Examples:
  nk touch /jobs/job1/_SUCCESS";

pub const EXPIRE: &str = "\
Examples:
  nk expire /jobs/j1 2h              # /jobs/j1 and all in it go in 2 hours
  nk expire /cache/big never         # keep it after all
  nk expire --child /cache 10m       # new children of /cache live 10 minutes
  nk mkdir --ttl 30m /tmp/scratch    # the same at create (nk put --ttl too)
  nk stat /jobs/j1                   # expires: ... (in 1h59m)
";

pub const RUN: &str = "\
Examples:
  nk run --bind /jobs/j1 -- ./etl.sh      # /jobs/j1 exists while etl.sh runs
  nk run --bind /jobs/j1 -- sh -c 'nk put out.csv $NK_BIND/'
  nk run --lease 30s --bind /tmp/a --bind /tmp/b -- make
  (if nk run is killed, the directories go once the lease lapses)
";

pub const STAT: &str = "\
Examples:
  nk stat /jobs/in.csv
  nk stat --blocks /jobs/in.csv       where each block is
  nk stat --json '/jobs/*'";

pub const FIND: &str = "\
Examples:
  nk find /jobs -name '*.parquet'
  nk find /jobs -type d -maxdepth 1
  nk find / --type t --json";

pub const DU: &str = "\
Examples:
  nk du -sh /jobs              instant: from the metadata servers' accounting
  nk du -sh --stored /jobs     what /jobs's data takes of the cluster
  nk du -s /jobs --json        nodes, blocks per storage class, quota
  nk du /jobs                  every container below /jobs (a walk)";

pub const QUOTA_SET: &str = "\
Examples:
  nk quota set /jobs --bytes 50GiB --nodes 1M
  nk quota set /jobs --nodes none      keep the byte limit, drop the node limit
  nk quota set /jobs --clear
  nk quota show
  nk du -sh /jobs";

pub const TEST: &str = "\
Examples:
  nk test -e /jobs/job1/_SUCCESS && echo done
  if nk test -d /jobs/job1; then ...; fi";

pub const COMPLETION: &str = "\
Examples:
  nk completion bash > /etc/bash_completion.d/nk
  nk completion zsh > \"${fpath[1]}/_nk\"
  nk completion fish > ~/.config/fish/completions/nk.fish";

pub const SNAPSHOT: &str = "\
Examples:
  nk snapshot /jobs ./snap-jobs";

pub const RESTORE: &str = "\
Examples:
  nk restore ./snap-jobs /jobs-restored
  nk restore --force ./snap-jobs /jobs";

pub const KV_PUT: &str = "\
Examples:
  nk kv put /cache/greeting hello
  nk kv put /cache/blob - < blob.bin";
