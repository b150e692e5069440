source .device/setup.sh || exit 1
mkdir -p /tmp/b && tar -xf .device/tb.tar -C /tmp/b
export ACCELERATE_MIXED_PRECISION=bf16
A=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
prof() { (cd $1 && PYTHONPATH=$1:/tmp/site timeout 80 python3 -m accel_mnist train --config recipes/fast99_graph.yaml --max-steps 30 --profile 10 --output-dir /tmp/p_$2 > $OUT/prof_$2.log 2>&1; python3 -c "import json; r=json.load(open('/tmp/p_$2/results.json')); p=r['profile']; json.dump(p, open('$OUT/prof_$2.json','w')); print('$2', r.get('step'), r.get('mixed_precision'), p['kernels_per_step'], p['device_us_per_step'], p['us_per_step'])"); }
rep() { (cd $1 && PYTHONPATH=$1:/tmp/site timeout 90 python3 -m benchmarks.repeat --config recipes/fast99_graph.yaml --seeds 0-19 > $OUT/repeat_$2.log 2>&1; tail -1 $OUT/repeat_$2.log | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); print('$2', r['share_reached'], round(r['mean_seconds'],4), round(r['stdev_seconds'],4), round(r['min_seconds'],4), round(r['max_seconds'],4), [s['step'] for s in r['seeds']].count('cuda_graph'))"); }
prof /tmp/b before; prof $A after
rep /tmp/b before; rep $A after; rep /tmp/b before2; rep $A after2
