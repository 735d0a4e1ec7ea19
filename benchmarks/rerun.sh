#!/usr/bin/env bash
# The rerun an operator does after every reboot and re-provisioning, timed: site.yml on
# the demo fleet `make demo` brought up, which must change nothing. Prints and saves
# (benchmarks/results/rerun-<date>/): the wall time, each host's changed count, the
# slowest roles and tasks (ansible.posix's profile_roles / profile_tasks callbacks), the
# task count per host, and which hosts were settled (nothing changed since the last whole
# run: the stages left them out, docs/upgrades.md "Reruns") or why not.
#   make demo                      # once: the four demo hosts, deployed
#   benchmarks/rerun.sh            # the rerun
#   benchmarks/rerun.sh --reboot   # every demo host restarted first (the simulated reboot)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH" ANSIBLE_CONFIG="$PWD/ansible.cfg" ANSIBLE_NOCOLOR=1
reboot=false
[ "${1:-}" = "--reboot" ] && reboot=true
out="benchmarks/results/rerun-$(date -u +%Y-%m-%d)${RUN_SUFFIX:-}"
mkdir -p "$out"
hosts=$(ansible-inventory -i inventories/demo --list | python3 -c \
  'import json,sys; d=json.load(sys.stdin); print(" ".join(sorted(d["_meta"]["hostvars"])))')
for h in $hosts; do
  docker inspect -f '{{.State.Running}}' "$h" 2>/dev/null | grep -q true \
    || { echo "rerun: $h is not running: run 'make demo' first" >&2; exit 1; }
done
if $reboot; then
  echo "== restarting $hosts (the simulated reboot)"
  docker restart $hosts >/dev/null
  for h in $hosts; do
    for _ in $(seq 90); do
      state=$(docker exec "$h" systemctl is-system-running 2>/dev/null || true)
      case "$state" in running|degraded) break ;; esac
      sleep 1
    done
  done
fi
log="$out/site$($reboot && echo -after-reboot || true).log"
echo "== ansible-playbook -i inventories/demo site.yml (log: $log)"
start=$(date +%s.%N)
set +e
ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks,ansible.posix.profile_roles,ansible.posix.timer \
  PROFILE_TASKS_TASK_OUTPUT_LIMIT=25 PROFILE_TASKS_SORT_ORDER=descending \
  ansible-playbook -i inventories/demo site.yml >"$log" 2>&1
rc=$?
set -e
wall=$(python3 -c "import time; print('%.1f' % (time.time() - $start))")
summary="$out/summary$($reboot && echo -after-reboot || true).txt"
python3 - "$log" "$wall" "$rc" "$hosts" >"$summary" <<'EOF'
import re, sys
log, wall, rc, hosts = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3], sys.argv[4].split()
print("site.yml rerun on the demo fleet: %s s wall, exit %s" % (wall, rc))
changed = {}
for host in hosts:
    for line in log.splitlines():
        if line.startswith(host + " ") and "ok=" in line:
            counts = dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", line))
            changed[host] = counts
            print("  %-22s ok=%-4d changed=%d failed=%d skipped=%d" % (
                host, counts.get("ok", 0), counts.get("changed", 0), counts.get("failed", 0), counts.get("skipped", 0)))
print("changed in all: %d (0 expected)" % sum(c.get("changed", 0) for c in changed.values()))
settled = sorted(set(re.findall(r"(\S+) is settled: nothing changed since", log)))
print("settled (the stages left them out): %d of %d%s" % (len(settled), len(hosts), (": " + ", ".join(settled)) if settled else ""))
for host, why in re.findall(r"Every stage runs on (\S+?): ([^\n]*(?:\n {8}\S[^\n]*)*)", log):
    print("  not settled: %s: %s" % (host, " ".join(why.split()).strip(" '")))
# profile_roles prints "name ---- 12.34s" lines after the recap, then profile_tasks its own
blocks = log.split("PLAY RECAP")[-1]
timed = re.findall(r"^(.+?) -{3,} (\d+\.\d+)s$", blocks, re.M)
print("slowest (roles first, then tasks):")
for name, seconds in timed[:40]:
    print("  %7ss  %s" % (seconds, name.strip()))
EOF
cat "$summary"
exit "$rc"
