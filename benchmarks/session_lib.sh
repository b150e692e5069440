# Helpers shared by the GPU session scripts; source it after setting R (the runs folder).
run() {  # run NAME CMD...: time the whole command (launch included), keep its log in $R
  local name=$1; shift
  local t0; t0=$(date +%s.%N)
  "$@" >"$R/$name.log" 2>&1
  local rc=$?
  echo "{\"name\": \"$name\", \"rc\": $rc, \"wall_seconds\": $(awk "BEGIN {print $(date +%s.%N) - $t0}")}" >"$R/$name.wall.json"
  echo "$(date +%T) $name rc=$rc $(cat "$R/$name.wall.json")"
}
gpu0() ( export CUDA_VISIBLE_DEVICES=0; "$@" )
gpu1() ( export CUDA_VISIBLE_DEVICES=1; "$@" )
launch() { accelerate launch --config_file "accelerate_configs/$1.yaml" "${@:2}"; }
