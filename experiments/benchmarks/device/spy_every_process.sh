#!/bin/bash
# Profile a cold command and every Python process its Ray starts, from their first moments:
#   spy_every_process.sh PY_SPY OUT_RAW SECONDS -- command...
# py-spy's --subprocesses does not reach Ray's processes (the raylet starts them), so this polls
# the process table every 50 ms and attaches py-spy (100 Hz, idle stacks kept) to each new Ray
# Python process (workers, agents) for the rest of SECONDS; the command itself is profiled
# from its start. OUT_RAW: every process's collapsed stacks, each line prefixed with
# "<title> <pid>;".
SPY=$1; OUT_RAW=$2; SECONDS_LEFT=$3; shift 4
WORK=$(mktemp -d)
$SPY record --idle -r 100 --format raw -o $WORK/command.raw -- "$@" >$WORK/command.log 2>&1 &
COMMAND=$!
END=$(( $(date +%s) + SECONDS_LEFT ))
declare -A SEEN TITLE
while kill -0 $COMMAND 2>/dev/null && [ $(date +%s) -lt $END ]; do
  while read -r pid args; do
    case "$args" in
      ray::IDLE*|"") ;;
      ray::*) TITLE[$pid]=${args%% *} ;;
      *dashboard/agent.py*|*runtime_env/agent*) TITLE[$pid]=agent ;;
    esac
    if [ -z "${SEEN[$pid]:-}" ]; then
      SEEN[$pid]=1
      left=$(( END - $(date +%s) )); [ $left -lt 1 ] && left=1
      $SPY record --idle -r 100 -p $pid -d $left --nonblocking --format raw -o $WORK/$pid.raw >/dev/null 2>&1 &
    fi
  done < <(pgrep -af "default_worker.py|ray::|dashboard/agent.py|runtime_env/agent")
  sleep 0.05
done
wait $COMMAND
sleep 1; pkill -INT -f "py-spy record.*-p" 2>/dev/null; sleep 1
{ sed "s/^/command;/" $WORK/command.raw
  for f in $WORK/[0-9]*.raw; do [ -s $f ] || continue; pid=$(basename $f .raw); sed "s/^/${TITLE[$pid]:-worker} $pid;/" $f; done; } > $OUT_RAW
grep -v "^py-spy>" $WORK/command.log | tail -3
rm -rf $WORK
