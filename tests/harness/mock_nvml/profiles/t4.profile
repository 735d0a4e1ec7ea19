# One Tesla T4 (Turing, CC 7.5): the non-Volta card for negative tests.
# 16 GB GDDR6 of which 15360 MiB is usable, 256-bit at 5001 MHz (320 GB/s), 70 W.
gpu_count=1
gpu.name=Tesla T4
gpu.uuid=GPU-c5a90f17-e43b-4d6c-a208-3b7e91d4f560
gpu.serial=1322120034591
gpu.pci_bus_id=00000000:3B:00.0
gpu.pci_device_id=0x1EB810DE
gpu.pci_subsystem_id=0x12A210DE
gpu.minor_number=0
gpu.numa_node=0
gpu.cpu_affinity=0-19,40-59
gpu.memory_total_bytes=16106127360
# Approximate driver reservation.
gpu.memory_reserved_bytes=269484032
gpu.bar1_total_bytes=268435456
gpu.cuda_cc_major=7
gpu.cuda_cc_minor=5
# nvmlDeviceArchitecture_t: Turing = 6
gpu.architecture=6
gpu.memory_bus_width_bits=256
gpu.max_mem_clock_mhz=5001
gpu.max_gfx_clock_mhz=1590
gpu.max_sm_clock_mhz=1590
gpu.default_app_mem_clock_mhz=5001
gpu.default_app_gfx_clock_mhz=585
gpu.idle_gfx_clock_mhz=300
gpu.supported_mem_clocks_mhz=5001
# At 5001 MHz memory: 1590 down to 300 MHz in 15 MHz steps.
gpu.supported_gfx_clocks_mhz=1590,1575,1560,1545,1530,1515,1500,1485,1470,1455,1440,1425,1410,1395,1380,1365,1350,1335,1320,1305,1290,1275,1260,1245,1230,1215,1200,1185,1170,1155,1140,1125,1110,1095,1080,1065,1050,1035,1020,1005,990,975,960,945,930,915,900,885,870,855,840,825,810,795,780,765,750,735,720,705,690,675,660,645,630,615,600,585,570,555,540,525,510,495,480,465,450,435,420,405,390,375,360,345,330,315,300
gpu.power_min_mw=60000
gpu.power_max_mw=70000
gpu.power_default_mw=70000
gpu.idle_power_mw=9000
gpu.idle_temp_c=29
gpu.nvlink_link_count=0
gpu.nvlink_peers=
