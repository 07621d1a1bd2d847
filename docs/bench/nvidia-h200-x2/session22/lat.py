# dist − raw (and safe − raw), paired by round, per point; median and largest over points, per file.
import json, sys, statistics as st, glob
for f in sorted(glob.glob(sys.argv[1])):
    r = json.load(open(f))['results']
    pts = {}
    for x in r:
        key = (x['coll'], x['bytes'], x['in_place'])
        pts.setdefault(key, {})[x['layer']] = x['rounds_us']
    out = {}
    for layer in ('safe', 'dist'):
        diffs = []
        for key, l in pts.items():
            if layer in l and 'raw' in l:
                diffs.append((st.median([a - b for a, b in zip(l[layer], l['raw'])]), key))
        diffs.sort()
        out[layer] = (st.median([d for d, _ in diffs]), diffs[-1])
    print(f.split('/')[-1], 'safe-raw med %.3f max %.3f' % (out['safe'][0], out['safe'][1][0]),
          '| dist-raw med %.3f max %.3f %s' % (out['dist'][0], out['dist'][1][0], out['dist'][1][1]))
