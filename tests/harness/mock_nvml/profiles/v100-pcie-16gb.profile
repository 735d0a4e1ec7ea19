# One Tesla V100-PCIE-16GB on the second socket (NUMA node 1) of a 2 x 20 core host.
# PCIe V100: 250 W board, 1380 MHz max graphics clock, no NVLink.
gpu_count=1
gpu.name=Tesla V100-PCIE-16GB
gpu.uuid=GPU-71d3a8c5-52e9-4b06-8f2a-d94c6b0e13f7
gpu.serial=0322918106623
gpu.pci_bus_id=00000000:86:00.0
gpu.pci_device_id=0x1DB410DE
gpu.pci_subsystem_id=0x121410DE
gpu.minor_number=0
gpu.numa_node=1
gpu.cpu_affinity=20-39,60-79
gpu.memory_total_bytes=17179869184
# Approximate driver reservation (see the SXM2 profiles).
gpu.memory_reserved_bytes=324009984
gpu.bar1_total_bytes=17179869184
gpu.cuda_cc_major=7
gpu.cuda_cc_minor=0
gpu.architecture=5
gpu.memory_bus_width_bits=4096
gpu.max_mem_clock_mhz=877
gpu.max_gfx_clock_mhz=1380
gpu.max_sm_clock_mhz=1380
gpu.default_app_mem_clock_mhz=877
gpu.default_app_gfx_clock_mhz=1245
gpu.idle_gfx_clock_mhz=135
gpu.supported_mem_clocks_mhz=877
# At 877 MHz memory: 1380 down to 135 MHz, 167 clocks in ~7.5 MHz steps.
gpu.supported_gfx_clocks_mhz=1380,1372,1365,1357,1350,1342,1335,1327,1320,1312,1305,1297,1290,1282,1275,1267,1260,1252,1245,1237,1230,1222,1215,1207,1200,1192,1185,1177,1170,1162,1155,1147,1140,1132,1125,1117,1110,1102,1095,1087,1080,1072,1065,1057,1050,1042,1035,1027,1020,1012,1005,997,990,982,975,967,960,952,945,937,930,922,915,907,900,892,885,877,870,862,855,847,840,832,825,817,810,802,795,787,780,772,765,757,750,742,735,727,720,712,705,697,690,682,675,667,660,652,645,637,630,622,615,607,600,592,585,577,570,562,555,547,540,532,525,517,510,502,495,487,480,472,465,457,450,442,435,427,420,412,405,397,390,382,375,367,360,352,345,337,330,322,315,307,300,292,285,277,270,262,255,247,240,232,225,217,210,202,195,187,180,172,165,157,150,142,135
gpu.power_min_mw=100000
gpu.power_max_mw=250000
gpu.power_default_mw=250000
gpu.idle_power_mw=26000
gpu.idle_temp_c=31
gpu.nvlink_link_count=0
gpu.nvlink_peers=
