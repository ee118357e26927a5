set terminal pngcairo size 900,500 font 'sans,10'
set output 'examples/grpo_reward.png'
set title 'GRPO on addition:1-2'
set xlabel 'step'
set ylabel 'fraction'
set yrange [0:1]
set key top left
set grid
set datafile missing 'NaN'
set arrow from graph 0, first 0.492 to graph 1, first 0.492 nohead dashtype 2 lc rgb 'gray'
set label 'held-out accuracy after SFT' at graph 0.75, first 0.462 tc rgb 'gray'
plot 'examples/grpo_reward.png.dat' using 1:2 with lines lw 1.5 title 'train reward (mean)', \
     'examples/grpo_reward.png.dat' using 1:3 with linespoints pt 7 ps 0.6 lw 2 title 'held-out accuracy (greedy)'
