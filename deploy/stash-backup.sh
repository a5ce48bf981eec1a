#!/bin/sh
# One dated, verified copy of every memory file (stash backup, then stash
# verify), then only the newest STASH_BACKUP_KEEP copies are kept.
# Run by stash-backup.service; safe to run by hand as the stash user.
set -eu
dir=${STASH_BACKUP_DIR:-/var/backups/stash}
keep=${STASH_BACKUP_KEEP:-14}
stash=${STASH_BIN:-/opt/stash/bin/stash}
stamp=$(date -u +%Y%m%dT%H%M%SZ)
partial="$dir/.partial-$stamp"
# A copy that failed half way is removed, never counted as a backup.
trap 'rm -rf -- "$partial"' EXIT
"$stash" backup "$partial"
"$stash" verify "$partial"
mv -T -- "$partial" "$dir/$stamp"
# Names sort by time, and only verified copies carry a plain name.
ls -1d "$dir"/2*/ | head -n "-$keep" | xargs -r rm -rf --
echo "stash-backup: $dir/$stamp"
