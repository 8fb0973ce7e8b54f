#!/usr/bin/env bash
# bad_input.sh CASE PROGRAM EXAMPLE SCRATCH MPIEXEC NPFLAG [MPI ARGS...]: one case of the bad-input
# catalogue (docs/security.md). bad_input.sh --list: the cases.
#
# `prepare` commits checkpoints 1 and 2 of tests/bad_input_program.cpp (3 ranks) into SCRATCH/golden,
# beside a folder `outside` (a file and a valid checkpoint that links may point to). Every other
# case starts from a copy of it, damages one input (a checkpoint, a data file, a config, the
# storage), runs the program (or the Fashion-MNIST EXAMPLE for IDX files) and checks:
#   - the exit: non-zero with one error line on every rank naming what is wrong and where, or 0
#     with the documented fallback (a checkpoint skipped with a warning naming its file);
#   - every line is one line: no LibTorch backtrace;
#   - no committed checkpoint is lost: every checkpoint file there before the run is there after,
#     byte for byte, and every committed checkpoint the run wrote verifies;
#   - nothing outside the run directory (SCRATCH/CASE/runs/run) is created, changed or removed.
# The storage cases (read_only, full_disk) mount in a private mount namespace; where none can be
# made they exit 77 (CTest: Skipped) with the reason.
set -u
cases=(
  ckpt_truncated ckpt_bit_flip ckpt_missing_file ckpt_extra_file ckpt_symlink_out ckpt_dir_for_file
  ckpt_unknown_format ckpt_name_outside ckpt_manifest_missing ckpt_manifest_garbage ckpt_all_damaged
  ckpt_link_named_like_checkpoint ckpt_wrong_shapes ckpt_other_optimizer
  resume_missing resume_is_file resume_damaged
  idx_truncated idx_wrong_type idx_not_idx idx_empty idx_directory idx_corrupt_gzip idx_count_mismatch
  csv_ragged_row csv_non_numeric csv_empty csv_no_label csv_label_not_integer
  config_wrong_type config_not_object space_lower_above_upper num_samples_zero
  experiment_state_wrong_type experiment_state_truncated experiment_state_not_object
  storage_is_file storage_read_only storage_full_disk
)
if [ "${1:-}" = --list ]; then printf '%s\n' "${cases[@]}"; exit 0; fi
what=$1 prog=$2 example=$3 scratch=$4 mpiexec=$5 npflag=$6
shift 6
mpiargs=("$@")
golden=$scratch/golden
dir=$scratch/$what
log=$scratch/$what.log
fail() { echo "FAIL ($what): $*"; exit 1; }
mpi() { local n=$1; shift; timeout 120 "$mpiexec" "$npflag" "$n" "${mpiargs[@]}" "$@"; }

if [ "$what" = prepare ]; then
  rm -rf "$golden" && mkdir -p "$golden/outside"
  mpi 3 "$prog" --storage "$golden/runs" >"$log" 2>&1 || { cat "$log"; fail "the first run failed"; }
  for c in 1 2; do [ -f "$golden/runs/run/checkpoint_00000$c/manifest.json" ] || fail "checkpoint $c was not committed"; done
  echo "a file outside the run directory" >"$golden/outside/secret.txt"
  cp -a "$golden/runs/run/checkpoint_000002" "$golden/outside/checkpoint_copy"
  echo "ok: prepare (checkpoints 1 and 2)"
  exit 0
fi

# The storage cases run in a mount namespace of their own (this script again, inside it).
if [[ $what == storage_read_only || $what == storage_full_disk ]] && [ -z "${COHORT_BAD_INPUT_NS:-}" ]; then
  if ! why=$(unshare --mount --propagation private true 2>&1); then
    echo "skipped: cannot make a mount namespace (${why:-unshare failed}): needs root or CAP_SYS_ADMIN"
    exit 77
  fi
  COHORT_BAD_INPUT_NS=1 exec unshare --mount --propagation private bash "$0" "$what" "$prog" "$example" "$scratch" "$mpiexec" "$npflag" "${mpiargs[@]}"
fi

[ -d "$golden/runs/run/checkpoint_000002" ] || fail "no $golden: run the prepare case first"
rm -rf "$dir" && cp -a "$golden" "$dir"
run=$dir/runs/run
ck=$run/checkpoint_000002

# What each case does: `damage` (shell, in the run directory), the command's arguments, the
# expected exit (fail / ok), the patterns its output must match, the number of ranks.
ranks=3 expect=fail damage=: args=() extra=() patterns=() moved_aside=0
every_rank() { local r; for ((r = 0; r < ranks; r++)); do patterns+=("rank $r: error: (rank 0: )?$1"); done; }
skipped() { patterns+=("warning: skipping checkpoint $ck: $1" "resumed from checkpoint_000001"); expect=ok; moved_aside=1; }
train=(--storage "$dir/runs" --epochs 3)
data_file="" search=(--search --storage "$dir/runs")
fmnist=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}  # the variable: another copy of the files
fm() { ranks=2 data_file=$1 damage=$2; }  # FILE of the Fashion-MNIST folder, and what replaces it
csv() { printf "$1" >"$dir/data.csv"; args=(--csv "$dir/data.csv" --storage "$dir/runs"); }
case $what in
  ckpt_truncated) damage="truncate -s 10 $ck/model.safetensors"; skipped "$ck/model.safetensors: 10 bytes, the manifest says [0-9]+ \(truncated\?\)" ;;
  ckpt_bit_flip) damage="printf '\\xff' | dd of=$ck/optimizer.pt bs=1 seek=100 conv=notrunc status=none"
    skipped "$ck/optimizer.pt: checksum does not match the manifest" ;;
  ckpt_missing_file) damage="rm $ck/state.json"; skipped "$ck/state.json: listed in the manifest but missing" ;;
  ckpt_extra_file) damage="echo notes >$ck/notes.txt"; expect=ok; patterns=("resumed from checkpoint_000002") ;;
  ckpt_symlink_out) damage="rm $ck/rng.pt && ln -s $dir/outside/secret.txt $ck/rng.pt"; skipped "$ck/rng.pt: .*link" ;;
  ckpt_dir_for_file) damage="rm $ck/rng.pt && mkdir $ck/rng.pt"; skipped "$ck/rng.pt: not a regular file" ;;
  ckpt_unknown_format) damage="sed -i 's/\"format\": *1/\"format\": 99/' $ck/manifest.json"
    skipped "$ck/manifest.json: format 99 is not one this build reads \(1\)" ;;
  ckpt_name_outside) damage="sed -i 's|\"name\": *\"rng.pt\"|\"name\": \"../../../outside/secret.txt\"|' $ck/manifest.json"
    skipped "$ck/manifest.json: .*'../../../outside/secret.txt'" ;;
  ckpt_manifest_missing) damage="rm $ck/manifest.json"; skipped "$ck: no manifest.json \(an uncommitted or foreign directory\)" ;;
  ckpt_manifest_garbage) damage="echo 'not json{' >$ck/manifest.json"; skipped "$ck/manifest.json: not valid JSON" ;;
  ckpt_all_damaged) damage="rm $ck/manifest.json && truncate -s 0 $run/checkpoint_000001/model.safetensors"; expect=ok
    patterns=("warning: skipping checkpoint $ck: " "warning: skipping checkpoint $run/checkpoint_000001: .*model.safetensors: 0 bytes"
              "trained 3 epochs") ;;
  ckpt_link_named_like_checkpoint) damage="ln -s $dir/outside/checkpoint_copy $run/checkpoint_000009"; expect=ok
    patterns=("resumed from checkpoint_000002") ;;
  ckpt_wrong_shapes) extra=(--width 12)
    every_rank "checkpoint file $ck/model.safetensors: tensor 'l1.weight' has shape \[6, 3\], the model's has \[12, 3\]: it was saved from another model" ;;
  ckpt_other_optimizer) extra=(--optimizer adam)
    every_rank "checkpoint file $ck/optimizer.pt holds the state of a SGD optimizer, not of this Adam: build the optimizer the checkpoint was saved with" ;;
  resume_missing) extra=(--resume "$dir/nowhere")
    every_rank "run_config.resume_from_checkpoint: $dir/nowhere: does not exist: name a committed checkpoint directory" ;;
  resume_is_file) extra=(--resume "$dir/outside/secret.txt")
    every_rank "run_config.resume_from_checkpoint: $dir/outside/secret.txt: not a directory: name a committed checkpoint directory" ;;
  resume_damaged) damage="rm $ck/state.json"; extra=(--resume "$ck")
    every_rank "run_config.resume_from_checkpoint: $ck/state.json: listed in the manifest but missing: name a committed checkpoint directory" ;;
  idx_truncated) fm train-images-idx3-ubyte.gz "head -c 100000 $fmnist/train-images-idx3-ubyte.gz >train-images-idx3-ubyte.gz"
    every_rank "$dir/data/train-images-idx3-ubyte.gz at byte [0-9]+: short read: expected 47040000 data bytes, the file holds [0-9]+: the file is truncated" ;;
  idx_wrong_type) fm train-labels-idx1-ubyte.gz "printf '\\x00\\x00\\x0d\\x01\\x00\\x00\\x00\\x02ab' >train-labels-idx1-ubyte.gz"
    every_rank "$dir/data/train-labels-idx1-ubyte.gz at byte 2: unsupported element type 0x0d: only unsigned bytes \(0x08\) are read" ;;
  idx_not_idx) fm train-images-idx3-ubyte.gz "echo 'a text file, not IDX' >train-images-idx3-ubyte.gz"
    every_rank "$dir/data/train-images-idx3-ubyte.gz at byte 0: bad magic number \(expected 00 00 <type> <ndims>\): not an IDX file" ;;
  idx_empty) fm t10k-labels-idx1-ubyte.gz ": >t10k-labels-idx1-ubyte.gz"
    every_rank "$dir/data/t10k-labels-idx1-ubyte.gz at byte 0: short read of the 4-byte magic number: the file is truncated or empty" ;;
  idx_directory) fm train-images-idx3-ubyte.gz "mkdir train-images-idx3-ubyte.gz"
    every_rank "$dir/data/train-images-idx3-ubyte.gz: a directory, not an IDX file: check the path" ;;
  idx_corrupt_gzip) fm train-images-idx3-ubyte.gz "(printf '\\x1f\\x8b\\x08\\x00\\x00\\x00\\x00\\x00\\x00\\x03'; yes x | head -c 4000) >train-images-idx3-ubyte.gz"
    every_rank "$dir/data/train-images-idx3-ubyte.gz at byte 0: corrupt compressed data \(zlib: .*\): the file is damaged" ;;
  idx_count_mismatch) fm train-labels-idx1-ubyte.gz "ln -s $fmnist/t10k-labels-idx1-ubyte.gz train-labels-idx1-ubyte.gz"
    every_rank "Fashion-MNIST files in $dir/data do not match \(train\)" ;;
  csv_ragged_row) csv 'a,b,c,label\n1,2,3,0\n4,5,1\n'; every_rank "$dir/data.csv line 3: 3 fields, the header has 4" ;;
  csv_non_numeric) csv 'a,b,c,label\n1,2,x3,0\n'; every_rank "$dir/data.csv line 2: column 'c': 'x3' is not a number" ;;
  csv_empty) csv ''; every_rank "$dir/data.csv line 1: no header line: the file is empty" ;;
  csv_no_label) csv 'a,b,c,d\n1,2,3,0\n'; every_rank "$dir/data.csv line 1: no column named 'label': set csv_options::label_column" ;;
  csv_label_not_integer) csv 'a,b,c,label\n1,2,3,0.5\n'; every_rank "$dir/data.csv line 2: column 'label': '0.5' is not an integer label" ;;
  config_wrong_type) echo '{"lr": 0.1, "epochs": "two"}' >"$dir/params.json"; extra=(--config "$dir/params.json")
    every_rank "config .* does not parse into .*config: field 'epochs': .*type must be number, but is string: fix the config's keys and types" ;;
  config_not_object) echo '[0.1, 2]' >"$dir/params.json"; extra=(--config "$dir/params.json")
    every_rank "config \[0.1,2\] does not parse into .*config: a JSON array, not an object: " ;;
  space_lower_above_upper) args=("${search[@]}" --low 0.5 --high 0.1); every_rank "uniform\(0.5, 0.1\): low > high: pass the smaller bound first" ;;
  num_samples_zero) args=("${search[@]}" --samples 0); every_rank "tune_config.num_samples = 0: set it to at least 1" ;;
  experiment_state_wrong_type) damage="sed -i 's/\"next_trial\":2/\"next_trial\":\"two\"/' $run/experiment_state.json"; args=("${search[@]}")
    every_rank "$run/experiment_state.json: field 'next_trial' is \"two\", not a trial count: move it aside" ;;
  experiment_state_truncated) damage="truncate -s 100 $run/experiment_state.json"; args=("${search[@]}")
    every_rank "$run/experiment_state.json does not parse \(.*\): move it aside to start the experiment afresh" ;;
  experiment_state_not_object) damage="echo '[]' >$run/experiment_state.json"; args=("${search[@]}")
    every_rank "$run/experiment_state.json: it is not a JSON object: move it aside" ;;
  storage_is_file) args=(--storage "$dir/outside/secret.txt")
    every_rank "cannot create run directory $dir/outside/secret.txt/run \(.*\): set run_config.storage_path to a writable directory" ;;
  storage_read_only) damage="mount --bind $dir/runs $dir/runs && mount -o remount,bind,ro $dir/runs"
    every_rank "writing checkpoint checkpoint_000003 failed: cannot create $run/.staging/.* \(Read-only file system\): check free space and that run_config.storage_path is writable" ;;
  storage_full_disk) damage="full_disk"
    every_rank "writing checkpoint checkpoint_000003 failed: could not write $run/.staging/.* \([0-9]+ bytes written\): check free space" ;;
  *) fail "unknown case" ;;
esac
[ ${#args[@]} -eq 0 ] && args=("${train[@]}" "${extra[@]}")
program=$prog
if [ -n "$data_file" ]; then
  program=$example args=(--data "$dir/data" --epochs 1 --max-train 256 --storage "$dir/runs")
  mkdir -p "$dir/data"
  for f in "$fmnist"/*-ubyte.gz; do ln -s "$f" "$dir/data/"; done
fi

# The tuning cases: one finished experiment to restore from.
if [[ $what == experiment_state_* ]]; then
  rm -rf "$run"
  mpi 3 "$prog" "${search[@]}" >"$log" 2>&1 || { cat "$log"; fail "the first tuning run failed"; }
fi
full_disk() {  # the run directory on a 1 MiB tmpfs, filled but for what dd could not write
  cp -a "$dir/runs" "$dir/runs.copy" && mount -t tmpfs -o size=1m tmpfs "$dir/runs" && cp -a "$dir/runs.copy/." "$dir/runs/" &&
    rm -rf "$dir/runs.copy" && { dd if=/dev/zero of="$dir/runs/filler" bs=4k status=none 2>/dev/null; true; }
}

# What is outside the run directory (names, types, sizes, times, contents), and the checkpoint
# files in it, before and after.
# The case's folder and the shared golden copy are both watched; the run's working directory is
# the case's folder, so a file written relative to it is seen too.
outside() {
  (cd "$dir" && find . -path ./runs/run -prune -o -path ./runs/filler -prune -o -print0 | sort -z |
     xargs -0 stat -c '%n %F %s %y' && find . -path ./runs/run -prune -o -path ./runs/filler -prune -o -type f -print0 |
     sort -z | xargs -0 -r sha256sum)
  (cd "$golden" && find . -print0 | sort -z | xargs -0 stat -c 'golden/%n %F %s %y')
}
# (A damaged checkpoint newer than the one resumed from is moved aside to <name>.corrupt: kept.)
checkpoint_files() {
  (cd "$run" 2>/dev/null && find . -path '*/checkpoint_*/*' -type f -print0 | xargs -0 -r sha256sum |
     sed -E 's|/(checkpoint_[0-9]+)\.corrupt/|/\1/|' | LC_ALL=C sort)
}

if [ -n "$data_file" ]; then
  (cd "$dir/data" && rm -f "$data_file" && eval "$damage") || fail "could not damage the input"
elif [ "$damage" != : ]; then
  (cd "$run" && eval "$damage") || fail "could not damage the input"
fi
outside_before=$(outside)
checkpoints_before=$(checkpoint_files)

out=$(cd "$dir" && mpi $ranks "$program" "${args[@]}" 2>&1 </dev/null)
rc=$?
printf '%s\n' "$out" >"$log"
printf '%s\n' "$out" | grep -E "error|warning|resumed|trained" | head -12
[ $rc -eq 124 ] && fail "timed out: a hang"
case $expect in
  ok) [ $rc -eq 0 ] || fail "exit $rc, expected 0 (the documented fallback)" ;;
  fail) [ $rc -eq 1 ] || fail "exit $rc, expected 1 (an error, not a crash)" ;;
esac
grep -qE "terminate called|exited on signal|Segmentation fault|Aborted|AddressSanitizer" <<<"$out" && fail "a crash, not an error"
for p in "${patterns[@]}"; do grep -qE -- "$p" <<<"$out" || fail "the output does not match: $p"; done
if [ $expect = fail ]; then
  n=$(grep -cE "rank [0-9]+: error: " <<<"$out")
  [ "$n" -eq $ranks ] || fail "$n error lines for $ranks ranks (one each expected)"
fi
grep -qE "^(Exception raised from|frame #[0-9]+:)" <<<"$out" && fail "an error of more than one line (a LibTorch backtrace)"
outside_after=$(outside)
[ "$outside_before" = "$outside_after" ] || { diff <(echo "$outside_before") <(echo "$outside_after") | head; fail "something outside the run directory changed"; }
checkpoints_after=$(checkpoint_files)
lost=$(LC_ALL=C comm -23 <(echo "$checkpoints_before") <(echo "$checkpoints_after"))
[ -z "$lost" ] || fail "committed checkpoint files lost or changed: $lost"
[ $moved_aside = 0 ] || [ -d "$ck.corrupt" ] || fail "the damaged checkpoint was not moved aside to $ck.corrupt"
while IFS= read -r -d '' c; do
  [[ -f $c/manifest.json ]] || continue
  grep -qF "./${c#$run/}/" <<<"$checkpoints_before" && continue  # damaged on purpose, or checked above
  mpi 1 "$prog" --verify "$c" >/dev/null 2>&1 || fail "${c#$run/}, committed by this run, does not verify"
done < <(find "$run" -type d -name 'checkpoint_[0-9]*' ! -name '*.corrupt' -print0)
echo "ok: $what (exit $rc)"
