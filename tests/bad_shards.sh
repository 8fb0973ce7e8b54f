#!/usr/bin/env bash
# bad_shards.sh SHARDS OUT: damaged copies of the Fashion-MNIST shards in SHARDS (written by
# make_fashion_shards) for the bad-input tests of fashion_mnist_shards, one folder each in OUT:
#   undecodable     sample 000300's .jpg replaced by text (train-000001.tar rewritten, index removed)
#   missing_member  sample 000300's .cls left out
#   index_mismatch  train-000002.tar grown by one tar block after the index was written
#   truncated       train-000003.tar cut in the middle, index removed (it is counted, and fails)
set -euo pipefail
src=$1 out=$2
rm -rf "$out" && mkdir -p "$out"
rewrite() {  # FOLDER COMMAND: train-000001.tar extracted, COMMAND run in it, packed in the same member order
  local dir=$1 cmd=$2 tmp
  tmp=$(mktemp -d)
  tar -tf "$dir/train-000001.tar" >"$tmp/order"
  mkdir "$tmp/x" && tar -xf "$dir/train-000001.tar" -C "$tmp/x"
  (cd "$tmp/x" && eval "$cmd")
  grep -vxF -f <(cd "$tmp/x" && ls -1 | sort | comm -13 - <(sort "$tmp/order")) "$tmp/order" >"$tmp/kept" || true
  (cd "$tmp/x" && tar --format=ustar -cf "$dir/train-000001.tar" -T "$tmp/kept")
  rm -rf "$tmp" "$dir/index.json"
}
for c in undecodable missing_member index_mismatch truncated; do cp -r "$src" "$out/$c"; done
rewrite "$out/undecodable" "echo 'not a jpeg' >000300.jpg"
rewrite "$out/missing_member" "rm 000300.cls"
head -c 512 /dev/zero >>"$out/index_mismatch/train-000002.tar"
truncate -s 300000 "$out/truncated/train-000003.tar" && rm "$out/truncated/index.json"
echo "ok: damaged shards in $out"
